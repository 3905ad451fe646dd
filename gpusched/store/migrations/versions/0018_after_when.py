"""`submit --after ID:any` and `ID:failed`: `jobs.after_when`, how each of `after`'s jobs
must end for the job to start (core.after), in `after`'s order.
Nullable: older rows and jobs whose dependencies must all succeed (`ok`) have none, and
`after` keeps every id either way, so what reads only `after` (retention, copy) is
unchanged. A pass reads it (store.queued.Queued): the queue's triggers (revision 0017)
are made again to watch it too.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_queue_marks = importlib.import_module("gpusched.store.migrations.versions.0017_queue_marks")

# The columns a pass reads (tests/test_queue_marks.py checks that they cover them).
QUEUE_COLUMNS = (*_queue_marks.QUEUE_COLUMNS, "after_when")
JSON_COLUMNS = (*_queue_marks.JSON_COLUMNS, "after_when")


def upgrade() -> None:
    bind = op.get_bind()
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(bind).get_columns("jobs")}
    if "after_when" not in present:
        op.add_column("jobs", sa.Column("after_when", sa.JSON, nullable=True))
    _queue_marks.create_triggers(bind.dialect.name, QUEUE_COLUMNS, JSON_COLUMNS)


def downgrade() -> None:
    bind = op.get_bind()
    # The triggers first: SQLite refuses to drop a column a trigger names.
    _queue_marks.create_triggers(
        bind.dialect.name, _queue_marks.QUEUE_COLUMNS, _queue_marks.JSON_COLUMNS
    )
    op.drop_column("jobs", "after_when")
