"""Each earlier run of a job that was put back in the queue (`--requeue`, its node
declared down): the `job_attempts` table. The job's row is always its latest run; a
requeue first copies the run it ends here (node, started, ended, outcome), so `show`,
`history` and the dashboard list every run, and the run's real end, reported later by
its node, is written here too (or becomes the job's end, if it completed before the job
was run again: `Attempts.requeued_run_ended`), or, if it still runs when its node is
heard again and the job has not started elsewhere, the run is taken back
(`Attempts.take_back_requeued`) and its attempt removed: it never ended.

`store.attempts` (`Attempts`) owns this table's reads and the end of a requeued run; the
requeue itself (`record_requeued`) runs inside store.placements' `declare_down`, whose
transaction it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Text,
    case,
    func,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection

from gpusched.core.models import EndReason, JobState
from gpusched.store.database import Database
from gpusched.store.nodes import db_iso, node_is_live
from gpusched.store.rows import decode_json
from gpusched.store.schema import job_attempts, jobs


@dataclass(frozen=True)
class RunHere:
    """A run of a job still going on a node, as that node finds its process: what taking
    it back (`take_back_requeued`) writes again, beside what its attempt kept."""

    job_id: int
    pid: int
    pid_start_time: str | None
    log_path: str | None


def record_requeued(
    conn: Connection,
    job_id: int,
    *,
    node: str,
    started_at: str | None,
    cards: tuple[list[str], list[int]],
    now: str,
    why: str,
) -> None:
    """In the requeue's transaction: the run it ends, as the job's next attempt (`cards`:
    the uuids and indices of the GPUs it held)."""
    last = conn.execute(
        select(func.max(job_attempts.c.attempt)).where(job_attempts.c.job_id == job_id)
    ).scalar()
    conn.execute(
        job_attempts.insert().values(
            job_id=job_id,
            attempt=int(last or 0) + 1,
            node=node,
            started_at=started_at,
            ended_at=now,
            outcome=f"queued again: {why}",
            gpu_uuids=cards[0],
            gpu_indices=cards[1],
        )
    )


def record_real_end(conn: Connection, job_id: int, node: str, outcome: str) -> bool:
    """A requeued run's real end, as its node reported it once back (False: no run of
    this job on `node` was requeued)."""
    last = conn.execute(
        select(func.max(job_attempts.c.attempt)).where(
            job_attempts.c.job_id == job_id, job_attempts.c.node == node
        )
    ).scalar()
    if last is None:
        return False
    conn.execute(
        update(job_attempts)
        .where(
            job_attempts.c.job_id == job_id,
            job_attempts.c.attempt == last,
            ~job_attempts.c.outcome.contains("; then "),  # said once
        )
        .values(outcome=job_attempts.c.outcome + f"; then {outcome}")
    )
    return True


class Attempts:
    """`store.attempts`: the earlier runs of requeued jobs, as `show` and `history` list them."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def earlier_runs(self, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """The earlier runs of these jobs, oldest first (jobs never requeued: absent)."""
        found: dict[int, list[dict[str, Any]]] = {}
        if not job_ids:
            return found
        with self.db.read() as conn:
            rows = conn.execute(
                select(job_attempts)
                .where(job_attempts.c.job_id.in_(list(job_ids)))
                .order_by(job_attempts.c.job_id, job_attempts.c.attempt)
            ).all()
        for row in rows:
            found.setdefault(int(row.job_id), []).append(
                {
                    "attempt": int(row.attempt),
                    "node": row.node,
                    "started_at": row.started_at,
                    "ended_at": row.ended_at,
                    "outcome": row.outcome,
                }
            )
        return found

    def requeued_run_ended(
        self, job_id: int, node: str, words: str, exit_code: int | None
    ) -> bool | None:
        """The real end of a run of a requeued job, reported by its node (`node`) once
        back: said on that run's attempt. If that run exited by itself
        (`exit_code`) and the job has not started again, that is the job's end: done or
        failed as the exit code says, so it is not run a second time. None: not ended
        here; else whether it has notification hooks to run."""
        with self.db.write() as conn:
            if not record_real_end(conn, job_id, node, words) or exit_code is None:
                return None
            started = conn.execute(
                select(job_attempts.c.started_at)
                .where(job_attempts.c.job_id == job_id, job_attempts.c.node == node)
                .order_by(job_attempts.c.attempt.desc())
            ).first()
            done = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state.in_([str(JobState.QUEUED), str(JobState.HELD)]),
                    jobs.c.requeue.is_not(None),
                )
                .values(
                    state=str(JobState.DONE if exit_code == 0 else JobState.FAILED),
                    reason=str(EndReason.EXIT),
                    reason_detail=f"its run on node {node} ended before it was run again",
                    exit_code=exit_code,
                    node=node,
                    node_epoch=None,
                    started_at=None if started is None else started[0],
                    ended_at=db_iso(conn, self.db.lease_clock),
                    waiting_reason=None,
                    hooks_due=case((jobs.c.notify.is_not(None), 1), else_=None),
                )
            )
            if done.rowcount != 1:
                return None
            notify = conn.execute(
                select(type_coerce(jobs.c.notify, Text)).where(jobs.c.id == job_id)
            ).scalar()
        return decode_json(notify) is not None

    def take_back_requeued(self, name: str, epoch: int, runs: Sequence[RunHere]) -> list[int]:
        """Jobs queued again when node `name` was declared down whose runs still go on
        there: `running` there again under its current `epoch`, as they were (on the cards
        and from the start their attempt kept), if the job is still queued (not started,
        ended or held since) and its last run is the one on `name`; that run's attempt is
        removed, since it never ended. One transaction: the ids taken back (a job claimed
        elsewhere meanwhile is not)."""
        taken: list[int] = []
        with self.db.write() as conn:
            if not node_is_live(conn, name, epoch, self.db.lease_clock):
                return []
            for run in runs:
                last = conn.execute(
                    select(job_attempts)
                    .where(job_attempts.c.job_id == run.job_id)
                    .order_by(job_attempts.c.attempt.desc())
                ).first()
                if last is None or last.node != name or last.gpu_uuids is None:
                    continue  # never requeued from here, run elsewhere since, or no cards kept
                done = conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.id == run.job_id,
                        jobs.c.state == str(JobState.QUEUED),
                        jobs.c.requeue.is_not(None),
                    )
                    .values(
                        state=str(JobState.RUNNING),
                        node=name,
                        node_epoch=epoch,
                        gpu_uuids=list(last.gpu_uuids),
                        gpu_indices=list(last.gpu_indices or []),
                        pid=run.pid,
                        pid_start_time=run.pid_start_time,
                        log_path=run.log_path,
                        started_at=last.started_at,
                        waiting_reason=None,
                    )
                )
                if done.rowcount != 1:
                    continue
                conn.execute(
                    job_attempts.delete().where(
                        job_attempts.c.job_id == run.job_id, job_attempts.c.attempt == last.attempt
                    )
                )
                taken.append(run.job_id)
        return taken
