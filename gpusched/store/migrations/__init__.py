"""The store's schema history as Alembic revisions (versions/), run by gpusched.store.schema.

Shipped inside the package: the daemon upgrades its database at start with no alembic.ini.
A developer adds a revision (from script.py.mako beside this file) with

    python -c "from alembic.config import Config; from alembic import command; \\
        c = Config(); c.set_main_option('script_location', 'gpusched/store/migrations'); \\
        command.revision(c, 'what changed', rev_id='0002')"

then writes its upgrade() with `op` calls, changes gpusched.store.database's tables to
match (tests/test_schema.py compares them), sets gpusched.store.schema.HEAD to the new
revision (checked too) and copies any new table in gpusched.store.copy, and runs
`ruff format`. Every revision must
run on SQLite and PostgreSQL (test_schema runs them on both); on SQLite, change a column
inside `with op.batch_alter_table(...)`, which copies the table.
"""
