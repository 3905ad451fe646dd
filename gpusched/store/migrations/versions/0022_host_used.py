"""What a job used of the server itself, recorded at its end from its supervisor's exit
record: `jobs.host_peak` (the most host memory its cgroup held at once, bytes) and
`jobs.cpu_s` (its processes' CPU time, seconds). Nullable: older rows, and jobs that
had no memory cgroup (host_peak) or no record, have none. No pass reads them.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(bind).get_columns("jobs")}
    if "host_peak" not in present:
        op.add_column("jobs", sa.Column("host_peak", sa.BigInteger, nullable=True))
    if "cpu_s" not in present:
        op.add_column("jobs", sa.Column("cpu_s", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "cpu_s")
    op.drop_column("jobs", "host_peak")
