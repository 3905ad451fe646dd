"""The store's schema history as Alembic revisions (versions/), run by gpusched.store.schema.

Shipped inside the package: the daemon upgrades its database at start with no alembic.ini.
A developer adds a revision with the template beside this file, e.g.
    alembic -x url=sqlite:////tmp/x.db -c /dev/null revision -m "what" \\
        --version-path gpusched/store/migrations/versions
or, simpler, by copying the latest file in versions/ and setting `down_revision` to its
`revision`. Every revision must run on SQLite and PostgreSQL (tests/test_schema.py runs
them on both).
"""
