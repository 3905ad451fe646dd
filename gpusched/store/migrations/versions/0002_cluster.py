"""The cluster (docs/cluster.md): `nodes` (each server's lease, state and reported GPUs),
`leases` (the scheduler's election), and five `jobs` columns: the node a job is placed on,
that node's epoch then, the nodes it may go to (`submit --node`), whether it goes back
to the queue when its node dies (`submit --requeue`), and why it waits (written by the
scheduler, read by every daemon's `status`). All new, all nullable: an
upgraded queue reads as jobs of no node, which a one-server daemon shows as its own.

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
    op.add_column("jobs", sa.Column("node", sa.String, nullable=True))
    op.add_column("jobs", sa.Column("node_epoch", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("allowed_nodes", sa.JSON, nullable=True))
    op.add_column("jobs", sa.Column("requeue", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("waiting_reason", sa.Text, nullable=True))
    op.create_index("ix_jobs_node", "jobs", ["node"])
    op.create_table(
        "nodes",
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("lease_expires", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("drain_reason", sa.Text, nullable=True),
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("report", sa.Text, nullable=True),
    )
    op.create_table(
        "leases",
        sa.Column("role", sa.String, primary_key=True),
        sa.Column("holder", sa.String, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.drop_table("nodes")
    op.drop_index("ix_jobs_node", "jobs")
    for column in ("waiting_reason", "requeue", "allowed_nodes", "node_epoch", "node"):
        op.drop_column("jobs", column)
