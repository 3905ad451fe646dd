"""Placement: `head_claims` (the cards kept for the blocked head job,
kept across passes and restarts) and three `jobs` columns: `exclusive` (--exclusive: a
card to itself), `share` (--share: its owner says it is light) and `top` (put first by an
administrator, `gpusched top`; lower goes first). All nullable: an upgraded queue reads
as jobs without them.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing (see 0004: create_all() may have made them already).
    inspector = sa.inspect(op.get_bind())
    present = {column["name"] for column in inspector.get_columns("jobs")}
    for column in (
        sa.Column("exclusive", sa.Integer, nullable=True),
        sa.Column("share", sa.Integer, nullable=True),
        sa.Column("top", sa.Integer, nullable=True),
    ):
        if column.name not in present:
            op.add_column("jobs", column)
    if "head_claims" not in set(inspector.get_table_names()):
        op.create_table(
            "head_claims",
            sa.Column("job_id", sa.Integer, primary_key=True),
            sa.Column("gpu_uuids", sa.JSON, nullable=False),
            sa.Column("mem", sa.BigInteger, nullable=True),
        )


def downgrade() -> None:
    op.drop_table("head_claims")
    with op.batch_alter_table("jobs") as batch:
        for name in ("top", "share", "exclusive"):
            batch.drop_column(name)
