"""`submit --output PATH`: `jobs.output`, the template of the path the job's log goes to
({id}, {array}, {index}), opened by the job's owner (gpusched.processes.output). Nullable:
older rows and jobs without it log to log_dir/ID.log.

Revision ID: 0013
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing: a database made by create_all() from the current tables has it.
    present = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("jobs")}
    if "output" not in present:
        op.add_column("jobs", sa.Column("output", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "output")
