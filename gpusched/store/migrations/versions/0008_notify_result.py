"""How a job's `--notify` hook ended: `jobs.notify_result` (JSON: kind, exit_code, output,
the end of what it printed), shown by `show` and the dashboard. Before, a failing hook
(no `mail` on the server, say) was seen only in root's journal. Nullable: older rows and
jobs without a hook have none.

Revision ID: 0008
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("jobs")}
    if "notify_result" not in present:
        op.add_column("jobs", sa.Column("notify_result", sa.JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "notify_result")
