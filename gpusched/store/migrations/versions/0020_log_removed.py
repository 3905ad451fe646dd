"""`jobs.log_removed`: why the daemon removed an ended job's log before its time (its
owner's share of log_dir was full), for `show`. Nullable: a job whose log is there, or
was never removed so, has none.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(bind).get_columns("jobs")}
    if "log_removed" not in present:
        op.add_column("jobs", sa.Column("log_removed", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "log_removed")
