"""The policy's plain inputs made from the scheduler's readings (models → policy types).

`policy.py` stays pure and knows nothing of `Job` or `GpuState`; these conversions are
the scheduler's side of that boundary, used by every tick and by `status`.
"""

from __future__ import annotations

from datetime import datetime

from gpusched.core.models import GpuHealth, GpuState, Job
from gpusched.scheduling.gpu_budget import GpuSlot, RunningClaim
from gpusched.scheduling.policy import WaitingJob
from gpusched.store import Queued


def capacity_bytes(gpu: GpuState) -> int:
    """What jobs could ever use on a GPU: its total less what the driver keeps for itself.

    NVML's v2 memory call leaves driver-reserved memory out of both used and free, so it
    is the gap between used + free and the total; a lost GPU reads 0 and 0.
    """
    seen = gpu.used_bytes + gpu.free_bytes
    return seen if seen > 0 else gpu.total_bytes


def gpu_slot(gpu: GpuState, util: float | None = None) -> GpuSlot:
    return GpuSlot(
        gpu.uuid,
        gpu.index,
        gpu.total_bytes,
        gpu.free_bytes,
        usable=gpu.health == GpuHealth.OK,
        util_percent=util,
    )


def running_claim(
    job: Job, usage: dict[int, dict[str, int]], util: float | None = None
) -> RunningClaim:
    return RunningClaim(
        job.id,
        tuple(job.gpu_uuids),
        job.mem,
        usage.get(job.id, {}),
        job.user,
        job.array_id,
        util_percent=util,
    )


def epoch_seconds(moment: str | None) -> float:
    return datetime.fromisoformat(moment).timestamp() if moment else 0.0


def waiting_job(job: Queued) -> WaitingJob:
    return WaitingJob(
        job.id,
        job.mem,
        job.gpus,
        job.priority,
        job.user,
        job.array_id,
        job.max_concurrent,
        queue_order=job.retry_of,  # an OOM retry keeps its first attempt's place
    )
