"""When the blocked head of the queue is expected to start (`show`): the latest of the
`--time` ends of the running jobs on the cards kept for it (policy rule 1, its claim as
the store keeps it), or now if those have all run out of time.

Knowable only for the head with a claim: a job behind it waits for the head as well as
for cards, and the plan does not say for how long. Never promised where a job without
`--time` holds one of those cards, nor where no gpusched job does (then what holds the
head back is memory of processes gpusched did not start, or nothing it can time). An
expectation, not a promise: a job may end earlier, and one started beside the head
(backfill) never delays it. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpusched.core.models import Job
from gpusched.store import StoredClaim


def expected_start(
    job_id: int, claim: StoredClaim | None, running: Sequence[Job], now: datetime
) -> datetime | None:
    """Job `job_id`'s expected start, if it is the head of `claim`; None: unknown."""
    if claim is None or claim.job_id != job_id:
        return None
    kept = set(claim.gpu_uuids)
    ends: list[datetime] = []
    for job in running:
        if kept.isdisjoint(job.gpu_uuids):
            continue
        if job.time_limit_s is None or job.started_at is None:
            return None  # it may run for ever
        ends.append(datetime.fromisoformat(job.started_at) + timedelta(seconds=job.time_limit_s))
    return max(now, *ends) if ends else None
