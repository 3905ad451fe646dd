"""`jobs.run_s`: how long a job ran, in seconds, as its supervisor measured it on the
monotonic clock, written with its end. Nullable: older rows, running jobs and jobs ended
without an exit record have none; what reads it falls back to ended_at - started_at.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(bind).get_columns("jobs")}
    if "run_s" not in present:
        op.add_column("jobs", sa.Column("run_s", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "run_s")
