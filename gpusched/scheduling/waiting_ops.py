"""The operations on a waiting job: priority, hold and release (the scheduler's, by
inheritance). Each is one compare-and-set in the store, under the scheduler's lock; a
refusal says which state the job is in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpusched.core.errors import ConflictError
from gpusched.core.models import Job, JobState
from gpusched.store import Store


class WaitingJobOperations:
    store: Store
    wake: Callable[[], None]
    _lock: threading.RLock

    def set_priority(self, job: Job, priority: int) -> Job:
        with self._lock:
            if not self.store.set_priority(job.id, priority):
                current = self.store.get(job.id)
                raise ConflictError(
                    f"job {job.id} is {current.state}: only a waiting job's priority can change"
                )
        self.wake()
        return self.store.get(job.id)

    def hold(self, job: Job) -> Job:
        with self._lock:
            if not self.store.hold(job.id):
                current = self.store.get(job.id)
                if current.state != JobState.HELD:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a queued job can be held"
                    )
            return self.store.get(job.id)

    def release(self, job: Job) -> Job:
        with self._lock:
            if not self.store.release(job.id):
                current = self.store.get(job.id)
                if current.state != JobState.QUEUED:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a held job can be released"
                    )
        self.wake()
        return self.store.get(job.id)
