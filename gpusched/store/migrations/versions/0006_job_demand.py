"""A job's GPU demand and what sharing a card cost it (gpusched.usage.demand): the
`demand` (0.0-1.0 of a card's busy time), `shared_with` (ids of the busy jobs it took
turns with) and `sharing_speed` (its speed while it did, against alone) columns of `jobs`.
NULL on older rows: not measured.

Revision ID: 0006
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS = (("demand", sa.Float), ("shared_with", sa.JSON), ("sharing_speed", sa.Float))


def upgrade() -> None:
    existing = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("jobs")}
    for name, kind in _COLUMNS:
        if name not in existing:
            # Nullable: added in place on SQLite too (no table copy needed).
            op.add_column("jobs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name, _ in _COLUMNS:
            batch.drop_column(name)
