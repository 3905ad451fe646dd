"""Each job's memory and utilization over time: the `timeline_points` table.

A database of the version that introduced it before schema revisions (create_all, no
alembic_version) has the table already: it is kept as it is.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "timeline_points" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "timeline_points",
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("t", sa.Float, primary_key=True),  # epoch seconds of the point's first poll
        sa.Column("memory", sa.BigInteger, nullable=True),  # bytes, over all the job's GPUs
        sa.Column("util", sa.Float, nullable=True),  # 0-100
        sa.Column("samples", sa.Integer, nullable=False),  # polls the point stands for
        sqlite_with_rowid=False,  # the rows live in the primary key's b-tree
    )


def downgrade() -> None:
    op.drop_table("timeline_points")
