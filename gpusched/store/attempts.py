"""Each earlier run of a job that was put back in the queue (`--requeue`, its node
declared down): the `job_attempts` table. The job's row is always its latest run; a
requeue first copies the run it ends here (node, started, ended, outcome), so `show`,
`history` and the dashboard list every run, and the run's real end, reported later by
its node, is written here too (or becomes the job's end, if it completed before the job
was run again: store.placements `end_requeued`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, ForeignKey, Integer, String, Table, Text, func, select, update
from sqlalchemy.engine import Connection

from gpusched.store.database import Database, metadata

job_attempts = Table(
    "job_attempts",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, primary_key=True),  # 1 for the first run
    Column("node", String, nullable=True),
    Column("started_at", String, nullable=True),
    Column("ended_at", String, nullable=True),  # when it was put back in the queue
    Column("outcome", Text, nullable=False),  # what ended it, in words
)


def record_requeued(
    conn: Connection, job_id: int, *, node: str, started_at: str | None, now: str, why: str
) -> None:
    """In the requeue's transaction: the run it ends, as the job's next attempt."""
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


class AttemptRecords(Database):
    def attempts(self, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """The earlier runs of these jobs, oldest first (jobs never requeued: absent)."""
        found: dict[int, list[dict[str, Any]]] = {}
        if not job_ids:
            return found
        with self.read() as conn:
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
