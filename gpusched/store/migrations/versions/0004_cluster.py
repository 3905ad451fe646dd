"""The cluster (docs/cluster.md): `nodes` (each server's lease, state and reported GPUs),
`leases` (the scheduler's election), and five `jobs` columns: the node a job is placed on,
that node's epoch then, the nodes it may go to (`submit --node`), whether it goes back
to the queue when its node dies (`submit --requeue`), and why it waits (written by the
scheduler, read by every daemon's `status`). All new, all nullable: an
upgraded queue reads as jobs of no node, which a one-server daemon shows as its own.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing: a database made by create_all() from this package's current
    # tables (as tests/test_schema.py makes "the last release's") has them already.
    inspector = sa.inspect(op.get_bind())
    present = {column["name"] for column in inspector.get_columns("jobs")}
    for column in (
        sa.Column("node", sa.String, nullable=True),
        sa.Column("node_epoch", sa.Integer, nullable=True),
        sa.Column("allowed_nodes", sa.JSON, nullable=True),
        sa.Column("requeue", sa.Integer, nullable=True),
        sa.Column("waiting_reason", sa.Text, nullable=True),
    ):
        if column.name not in present:
            op.add_column("jobs", column)
    if "ix_jobs_node" not in {index["name"] for index in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_node", "jobs", ["node"])
    tables = set(inspector.get_table_names())
    if "nodes" not in tables:
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
    if "leases" not in tables:
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
