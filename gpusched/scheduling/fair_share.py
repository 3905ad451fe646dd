"""Fair share's input: each user's recent GPU memory-time, decayed by a half-life.

A job is charged, on each of its GPUs and for as long as it holds them, the larger of
what it declared (a whole card for a job with no --mem) and the most it was measured
holding on one GPU (`peak_mem`): a job that declares little and uses much pays for what it
used, and an honest job that uses less than it declared still pays for the room it kept
from others.

A job's time is its run time as its supervisor measured it on the monotonic clock where
recorded (`run_s`), so a wall-clock jump while it ran charges nothing.

Read from the store's recent jobs (running and ended) only when users compete: with one
user waiting, order within that user's queue needs no history. The dashboard's usage
page reads the same figure (`usage_by_user`) whoever waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from datetime import datetime, timedelta

from gpusched.core.clock import iso
from gpusched.core.models import GpuState, Job
from gpusched.scheduling.policy import UsageSpan, decayed_usage
from gpusched.scheduling.policy_inputs import epoch_seconds
from gpusched.store import Jobs


def recent_usage(
    jobs: Jobs,
    waiting_users: Set[str],
    gpus: Sequence[GpuState],
    now: datetime,
    half_life_s: float,
) -> dict[str, float]:
    """Recent decayed GPU memory-time per user; empty when fewer than two users wait."""
    if len(waiting_users) < 2:
        return {}
    return usage_by_user(jobs, {g.uuid: g.total_bytes for g in gpus}, now, half_life_s)


# Past ten half-lives a job weighs under 0.1 % of what it did: it is left out.
WINDOW_HALF_LIVES = 10


def usage_by_user(
    jobs: Jobs, totals: Mapping[str, int], now: datetime, half_life_s: float
) -> dict[str, float]:
    """Each user's decayed GPU memory-time (byte-seconds) over the fair-share window.

    `totals`: each GPU's memory by uuid, what a whole-GPU job (no --mem) holds.
    """
    since = iso(now - timedelta(seconds=WINDOW_HALF_LIVES * half_life_s))
    spans = [
        UsageSpan(job.user, charged_bytes(job, totals), *_span(job, job.started_at))
        for job in jobs.usage_since(since)
        if job.started_at is not None
    ]
    return decayed_usage(spans, now.timestamp(), half_life_s)


def _span(job: Job, started_at: str) -> tuple[float, float | None]:
    """When a job held its cards, in epoch seconds (end None: still running). An ended
    job's run time is its supervisor's measure where recorded: a wall-clock jump while it
    ran moved its started_at, not what it held; ended_at is read after the jump."""
    if job.ended_at is None:
        return epoch_seconds(started_at), None
    end = epoch_seconds(job.ended_at)
    start = end - job.run_s if job.run_s is not None else epoch_seconds(started_at)
    return start, end


def charged_bytes(job: Job, totals: Mapping[str, int]) -> int:
    """What a job is charged per second: max(declared, measured peak) on each of its GPUs."""
    peak = job.peak_mem or 0
    return sum(
        max(job.mem if job.mem is not None else totals.get(uuid, 0), peak) for uuid in job.gpu_uuids
    )
