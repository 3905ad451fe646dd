"""`store.usage` (`Usage`): measured usage and OOM retries (for gpusched.usage.monitor and
scheduling.endings' `JobEndings.settle`).

What measuring a job may write (USAGE_COLUMNS), the daemon's usage tracker kept between
restarts, a job's OOM retry queued as a copy of its row, and the peaks of a user's past
runs of a command (for estimates).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, select, type_coerce, update

from gpusched.core.errors import NotFoundError
from gpusched.core.models import Job, JobState
from gpusched.store.database import Database
from gpusched.store.rows import inserted_id, job_select, to_job
from gpusched.store.schema import jobs
from gpusched.store.timeline import TimelineWrite, write_timeline

# What measuring a job may write (Usage.set_usage, Jobs.mark_ended's `usage`).
USAGE_COLUMNS = frozenset(
    {
        "peak_mem",
        "mean_util",
        "util_min",
        "util_max",
        "util_stddev",
        "hints",
        "overrun_at",
        "usage_state",
        "demand",
        "shared_with",
        "sharing_speed",
        "run_s",
        "host_peak",
        "cpu_s",
    }
)

# Columns that describe one run of a job: an OOM retry starts them afresh.
_PER_RUN_COLUMNS = frozenset(
    {
        "id",
        "state",
        "gpu_indices",
        "gpu_uuids",
        "started_at",
        "ended_at",
        "pid",
        "pid_start_time",
        "exit_code",
        "reason",
        "reason_detail",
        "node",  # where the run was placed (cluster): the retry is placed anew
        "node_epoch",
        "waiting_reason",
        "log_path",
        "retried_as",
        "hooks_due",  # the hooks of this run's end, not of the retry's
        "notify_result",  # how this run's --notify hook ended
        "request_id",  # the submit's: unique, it names the first attempt (a retry has none)
        *USAGE_COLUMNS,
    }
)


def usage_values(values: dict[str, Any]) -> dict[str, Any]:
    unknown = set(values) - USAGE_COLUMNS
    if unknown:
        raise ValueError(f"not a usage column: {sorted(unknown)}")
    return dict(values)


class Usage:
    """`store.usage`: a job's measured figures, its OOM retry, and past runs' figures."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def set_usage(self, job_id: int, timeline: TimelineWrite | None = None, **values: Any) -> None:
        """Write some of a job's measured figures (see USAGE_COLUMNS) and, in the same
        transaction, the new points of its time series (`timeline`)."""
        with self.db.write() as conn:
            # The series first, as at a job's end (store.transitions.mark_ended: why).
            write_timeline(conn, job_id, timeline)
            if values:
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(**usage_values(values)))

    def usage_state(self, job_id: int) -> dict[str, Any] | None:
        with self.db.read() as conn:
            state = conn.execute(
                select(jobs.c.usage_state).where(jobs.c.id == job_id)
            ).scalar_one_or_none()
        return dict(state) if isinstance(state, dict) else None

    def add_retry(self, job_id: int, mem: int | None) -> Job:
        """Queue an OOM retry of an ended or ending job: its row copied with `mem`.

        Idempotent: a job already retried returns its retry. Every column is copied (so
        columns added later, such as an array id or a time limit, carry over) except those
        that describe one run. The retry keeps the original's `submitted_at`, and its
        `retry_of` (the first attempt's id) is its place in the queue.
        """
        with self.db.write() as conn:
            # Every column, the row locked (PostgreSQL; SQLite's BEGIN IMMEDIATE locks all)
            # so that two endings of one job cannot both queue a retry.
            row = conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).first()
            if row is None:
                raise NotFoundError(f"no job {job_id}")
            if row.retried_as is not None:
                retry = conn.execute(job_select().where(jobs.c.id == row.retried_as)).one()
                return to_job(retry)
            values = {
                column.name: getattr(row, column.name)
                for column in jobs.columns
                if column.name not in _PER_RUN_COLUMNS
            }
            values.update(
                state=str(JobState.QUEUED),
                mem=mem,
                gpu_indices=[],
                gpu_uuids=[],
                hints=[],
                retry_oom=max(0, (row.retry_oom or 0) - 1),
                retry_of=row.retry_of or row.id,
            )
            new_id = inserted_id(conn.execute(jobs.insert().values(**values)))
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(retried_as=new_id))
            retry = conn.execute(job_select().where(jobs.c.id == new_id)).one()
        return to_job(retry)

    def peaks_for_command(
        self, uid: int, command: Sequence[str], limit: int = 20
    ) -> list[tuple[int, int, int | None]]:
        """(id, peak_mem, declared mem) of the owner's latest successful runs of `command`.

        Only jobs that ended `done` count: a job that failed early never reached its
        working size, and one that ran out of memory shows the card's size, not its need.
        """
        wanted = list(command)
        query = (
            select(jobs.c.id, jobs.c.command, jobs.c.peak_mem, jobs.c.mem)
            .where(
                jobs.c.uid == uid,
                jobs.c.state == str(JobState.DONE),
                jobs.c.peak_mem.is_not(None),
            )
            .order_by(jobs.c.ended_at.desc(), jobs.c.id.desc())
            .limit(5000)  # a bound on the scan; the command is compared here, not in SQL
        )
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        found = [(row.id, row.peak_mem, row.mem) for row in rows if list(row.command) == wanted]
        return found[:limit]

    def demand_records(self, limit: int = 5000) -> list[tuple[Any, ...]]:
        """The latest recorded demands, newest first: (job id, uid, array id, name, command
        as JSON text (or decoded, on PostgreSQL), demand, whether it ended, whether it was
        interactive). One query for a whole pass's expected demands
        (gpusched.usage.demand_history)."""
        query = (
            select(
                jobs.c.id,
                jobs.c.uid,
                jobs.c.array_id,
                jobs.c.name,
                type_coerce(jobs.c.command, Text),
                jobs.c.demand,
                jobs.c.ended_at.is_not(None),
                jobs.c.interactive.is_not(None),
            )
            .where(jobs.c.demand.is_not(None))
            .order_by(jobs.c.ended_at.desc(), jobs.c.id.desc())
            .limit(limit)
        )
        with self.db.read() as conn:
            return [tuple(row) for row in conn.execute(query)]

    def record_usage(self, job_id: int, peak_mem: int | None) -> None:
        with self.db.write() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(peak_mem=peak_mem))
