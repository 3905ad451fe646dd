"""`submit --ram` and `--cpus`: `jobs.ram` (host memory, bytes) and `jobs.cpus` (cores),
what a job asks of the server itself beside its GPUs (the policy's host rule). Nullable:
older rows and jobs that gave neither take their GPUs' share of the server. A pass reads
them (store.queued.Queued): the queue's triggers (revision 0017) are made again to watch
them too.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_after_when = importlib.import_module("gpusched.store.migrations.versions.0018_after_when")
_queue_marks = importlib.import_module("gpusched.store.migrations.versions.0017_queue_marks")

# The columns a pass reads (tests/test_queue_marks.py checks that they cover them).
QUEUE_COLUMNS = (*_after_when.QUEUE_COLUMNS, "ram", "cpus")
JSON_COLUMNS = _after_when.JSON_COLUMNS


def upgrade() -> None:
    bind = op.get_bind()
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(bind).get_columns("jobs")}
    if "ram" not in present:
        op.add_column("jobs", sa.Column("ram", sa.BigInteger, nullable=True))
    if "cpus" not in present:
        op.add_column("jobs", sa.Column("cpus", sa.Integer, nullable=True))
    _queue_marks.create_triggers(bind.dialect.name, QUEUE_COLUMNS, JSON_COLUMNS)


def downgrade() -> None:
    bind = op.get_bind()
    # The triggers first: SQLite refuses to drop a column a trigger names.
    _queue_marks.create_triggers(
        bind.dialect.name, _after_when.QUEUE_COLUMNS, _after_when.JSON_COLUMNS
    )
    op.drop_column("jobs", "cpus")
    op.drop_column("jobs", "ram")
