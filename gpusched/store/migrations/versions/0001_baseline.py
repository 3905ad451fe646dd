"""The schema of gpusched 0.1 (jobs and envs), and the adoption of a database made before
Alembic.

A database of an earlier version has no alembic_version table: its `jobs` was made by
create_all() and then grew by "add the missing columns" at each start, so it may lack any
of the columns added since the first release (all nullable, read as NULL by old rows),
their indexes, and `envs`. Alembic runs this revision on it as on an empty database: what
is missing is added, nothing else is touched (but for the byte sizes, widened to BIGINT on
PostgreSQL, where INTEGER stops at 2 GiB), and the queue stays as it was.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _job_columns() -> list[sa.Column[object]]:
    # Frozen here as they were at this revision: later revisions change the schema with
    # operations of their own, never by editing this list.
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String, nullable=True),
        sa.Column("user", sa.String, nullable=False),
        sa.Column("uid", sa.Integer, nullable=False),
        sa.Column("gid", sa.Integer, nullable=False),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("command", sa.JSON, nullable=False),
        sa.Column("cwd", sa.Text, nullable=False),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("umask", sa.Integer, nullable=False),
        sa.Column("mem", sa.BigInteger, nullable=True),  # bytes: past 2**31 (PostgreSQL)
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_indices", sa.JSON, nullable=False),
        sa.Column("gpu_uuids", sa.JSON, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("after", sa.JSON, nullable=False),
        sa.Column("submitted_at", sa.String, nullable=False),
        sa.Column("started_at", sa.String, nullable=True),
        sa.Column("ended_at", sa.String, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("pid_start_time", sa.String, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("reason", sa.String, nullable=True),
        sa.Column("reason_detail", sa.Text, nullable=True),
        sa.Column("stop_intent", sa.String, nullable=True),
        sa.Column("log_path", sa.Text, nullable=True),
        sa.Column("peak_mem", sa.BigInteger, nullable=True),
        sa.Column("mean_util", sa.Integer, nullable=True),
        sa.Column("hints", sa.JSON, nullable=False),
        sa.Column("util_min", sa.Integer, nullable=True),
        sa.Column("util_max", sa.Integer, nullable=True),
        sa.Column("util_stddev", sa.Float, nullable=True),
        sa.Column("overrun_at", sa.String, nullable=True),
        sa.Column("retry_oom", sa.Integer, nullable=True),
        sa.Column("retry_of", sa.Integer, nullable=True),
        sa.Column("retried_as", sa.Integer, nullable=True),
        sa.Column("usage_state", sa.JSON, nullable=True),
        sa.Column("array_id", sa.Integer, nullable=True),
        sa.Column("array_index", sa.Integer, nullable=True),
        sa.Column("max_concurrent", sa.Integer, nullable=True),
        sa.Column("time_limit_s", sa.Float, nullable=True),
        sa.Column("notify", sa.JSON, nullable=True),
        sa.Column("hooks_due", sa.Integer, nullable=True),
        sa.Column("env_id", sa.Integer, nullable=True),
    ]


_JOB_INDEXES = {
    "ix_jobs_state": "state",
    "ix_jobs_ended_at": "ended_at",
    "ix_jobs_array_id": "array_id",
}


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    tables = set(inspector.get_table_names())
    if "jobs" not in tables:
        op.create_table("jobs", *_job_columns())
    else:  # a database of an earlier version: add what it lacks
        present = {column["name"]: column for column in inspector.get_columns("jobs")}
        for column in _job_columns():
            if column.name not in present:
                op.add_column("jobs", column)
            elif (
                op.get_bind().dialect.name == "postgresql"
                and isinstance(column.type, sa.BigInteger)
                and not isinstance(present[column.name]["type"], sa.BigInteger)
            ):  # sizes in bytes were INTEGER: 2**31 bytes and up did not fit
                op.alter_column("jobs", column.name, type_=sa.BigInteger)
    indexes = (
        {index["name"] for index in inspector.get_indexes("jobs")} if "jobs" in tables else set()
    )
    for name, column_name in _JOB_INDEXES.items():
        if name not in indexes:
            op.create_index(name, "jobs", [column_name])
    if "envs" not in tables:
        op.create_table(
            "envs",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("digest", sa.String, nullable=False, unique=True),
            sa.Column("env", sa.JSON, nullable=False),
        )


def downgrade() -> None:
    # Below the first revision there is no schema: going there would drop the queue.
    raise NotImplementedError("the first revision has no downgrade (it would drop every job)")
