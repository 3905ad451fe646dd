"""Each earlier run of a requeued job (`job_attempts`: node, started, ended,
outcome; the job's row is its latest run), and the request id of a submit
(`jobs.request_id`, unique: a submit retried after its answer was lost finds the job
it made instead of making a second).

Revision ID: 0015
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only what is missing: a database made by create_all() from the current tables has it.
    inspector = sa.inspect(op.get_bind())
    if "job_attempts" not in inspector.get_table_names():
        op.create_table(
            "job_attempts",
            sa.Column(
                "job_id",
                sa.Integer,
                sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                primary_key=True,
            ),
            sa.Column("attempt", sa.Integer, primary_key=True),
            sa.Column("node", sa.String, nullable=True),
            sa.Column("started_at", sa.String, nullable=True),
            sa.Column("ended_at", sa.String, nullable=True),
            sa.Column("outcome", sa.Text, nullable=False),
        )
    present = {column["name"] for column in inspector.get_columns("jobs")}
    if "request_id" not in present:
        op.add_column("jobs", sa.Column("request_id", sa.String, nullable=True))
    if "ix_jobs_request_id" not in {index["name"] for index in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_request_id", "jobs", ["request_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_jobs_request_id", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("request_id")
    op.drop_table("job_attempts")
