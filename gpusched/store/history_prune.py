"""Forgetting old history: ended jobs' rows (their timelines go with them, ON DELETE
CASCADE) and the environments no job refers to any more. What the rows pointed at on disk
(logs, job directories, hook outputs) is removed by gpusched.daemon.pruning.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select

from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES, Job
from gpusched.store.database import envs, jobs
from gpusched.store.queries import JobQueries

_CHUNK = 500  # rows per statement: a large prune never builds one huge IN list


class RetentionRecords(JobQueries):
    def ended_before(self, cutoff: str, limit: int) -> list[Job]:
        """Up to `limit` jobs that ended before `cutoff` (an ISO time in UTC, as `ended_at`
        is stored), oldest end first, except those an active job still waits for
        (`--after`): its dependency must stay to be judged."""
        query = (
            select(jobs.c.id)
            .where(jobs.c.state.in_([str(s) for s in TERMINAL_STATES]))
            .where(jobs.c.ended_at < cutoff)
            .order_by(jobs.c.ended_at, jobs.c.id)
            .limit(limit)
        )
        with self.read() as conn:
            ids = [int(i) for i in conn.execute(query).scalars()]
            waited_for = {
                int(i)
                for after in conn.execute(
                    select(jobs.c.after).where(jobs.c.state.in_([str(s) for s in ACTIVE_STATES]))
                ).scalars()
                for i in (after or [])
            }
        return list(self.iter_jobs([i for i in ids if i not in waited_for]))

    def delete_ended(self, job_ids: Sequence[int]) -> int:
        """Delete these jobs' rows if they are still ended (a job is never deleted while
        active), and every environment left without a job; how many rows went."""
        deleted = 0
        terminal = [str(s) for s in TERMINAL_STATES]
        with self._write() as conn:
            for start in range(0, len(job_ids), _CHUNK):
                chunk = list(job_ids[start : start + _CHUNK])
                result = conn.execute(
                    delete(jobs).where(jobs.c.id.in_(chunk), jobs.c.state.in_(terminal))
                )
                deleted += int(result.rowcount or 0)
            used = select(jobs.c.env_id).where(jobs.c.env_id.is_not(None))
            conn.execute(delete(envs).where(envs.c.id.not_in(used)))
        return deleted
