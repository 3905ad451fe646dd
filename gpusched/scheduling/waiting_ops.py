"""The operations on waiting jobs: priority, hold, release, and cancelling all of a
user's at once (`scheduler.waiting`, a collaborator the scheduler holds). Each is one
compare-and-set in the store, under the scheduler's lock; a refusal says which state the
job is in.
"""

from __future__ import annotations

import logging

from gpusched.core.clock import iso
from gpusched.core.errors import ConflictError
from gpusched.core.models import Job, JobState
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings

log = logging.getLogger("gpusched.scheduler")


# Why a job in another state was left as it was, by `change_many`'s action.
REFUSALS = {
    "hold": "only a queued job can be held",
    "release": "only a held job can be released",
    "priority": "only a waiting job's priority can change",
}


# The state a job already in is left as it was without a refusal, as by `hold`/`release`.
ALREADY = {"hold": JobState.HELD, "release": JobState.QUEUED}


class WaitingJobOperations:
    def __init__(self, context: Context, endings: JobEndings) -> None:
        self.jobs = context.store.jobs
        self._lock = context.lock  # one lock for passes, endings and operations
        self.settings = context.settings
        self.clock = context.clock
        self.endings = endings
        self.wake = context.wake

    def set_priority(self, job: Job, priority: int) -> Job:
        with self._lock:
            if not self.jobs.set_priority(job.id, priority):
                current = self.jobs.get(job.id)
                raise ConflictError(
                    f"job {job.id} is {current.state}: only a waiting job's priority can change"
                )
        self.wake()
        return self.jobs.get(job.id)

    def put_first(self, job: Job) -> Job:
        """An administrator's `gpusched top`: ahead of every user's jobs."""
        with self._lock:
            if not self.jobs.put_first(job.id):
                current = self.jobs.get(job.id)
                raise ConflictError(
                    f"job {job.id} is {current.state}: only a waiting job can be put first"
                )
        self.wake()
        return self.jobs.get(job.id)

    def hold(self, job: Job) -> Job:
        with self._lock:
            if not self.jobs.hold(job.id):
                current = self.jobs.get(job.id)
                if current.state != JobState.HELD:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a queued job can be held"
                    )
            return self.jobs.get(job.id)

    def release(self, job: Job) -> Job:
        with self._lock:
            if not self.jobs.release(job.id):
                current = self.jobs.get(job.id)
                if current.state != JobState.QUEUED:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a held job can be released"
                    )
        self.wake()
        return self.jobs.get(job.id)

    def change_many(
        self, jobs: list[Job], action: str, priority: int = 0
    ) -> tuple[list[Job], dict[int, str]]:
        """Hold, release or set the priority of many jobs in one hold of the lock, one
        transaction and one wake-up (`gpusched release 1 2 ... 40` took a pass per id):
        the jobs changed, as they are now, and why each other was refused."""
        with self._lock:
            changed = self.jobs.change_many([j.id for j in jobs], action, priority)
            now = self.jobs.get_many([j.id for j in jobs])
        if changed and action != "hold":
            self.wake()
        refused: dict[int, str] = {}
        for job in jobs:
            current = now[job.id]
            if job.id in changed or current.state == ALREADY.get(action):
                continue
            refused[job.id] = f"job {job.id} is {current.state}: {REFUSALS[action]}"
        return [now[j.id] for j in jobs if j.id not in refused], refused

    def cancel_waiting(
        self, uid: int, by: str, array_id: int | None = None, user: str | None = None
    ) -> list[int]:
        """Cancel all of a user's waiting jobs (of one array) at once: their ids. `user`:
        match the user name, not the uid (in a cluster).

        One transaction for any number (job by job, 100,000 took minutes); their ends
        are announced as `_end` announces one.
        """
        with self._lock:
            ended = self.jobs.cancel_waiting(
                uid,
                array_id,
                f"cancelled by {by}",
                iso(self.clock()),
                bool(self.settings.current.on_finish),
                user=user,
            )
            self.endings.announce_ends(ended)
        if ended:
            log.info("%d waiting jobs of uid %d cancelled by %s", len(ended), uid, by)
            self.wake()
        return [job_id for job_id, _ in ended]
