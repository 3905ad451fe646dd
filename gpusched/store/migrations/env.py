"""Alembic's environment script: runs the revisions on the connection gpusched hands it.

gpusched.store.migrations (this package) opens the transaction (and, on PostgreSQL, takes
the upgrade lock) and passes its connection in `config.attributes["connection"]`; nothing
is read from an alembic.ini or the environment.
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
# render_as_batch: SQLite alters a table by copying it; Alembic's batch mode does that.
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
