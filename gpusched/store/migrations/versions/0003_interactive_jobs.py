"""Interactive jobs (`gpusched run`, `gpusched.claim()`): the `interactive` column of
`jobs` (1 for such a job; NULL, read as false, for every other and for older rows).

Their client process is kept in the existing `pid` and `pid_start_time` columns.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("jobs")}
    if "interactive" in columns:
        return
    # A nullable column is added in place on SQLite too (no table copy needed).
    op.add_column("jobs", sa.Column("interactive", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("interactive")
