"""How the policy's reasons name a job's ask, a card and jobs: "8.0G on 1 GPU", "GPU 2 on
b", "jobs 3, 4, 5, 6, 7 and 13 more".

Pure; every rule's reason says a job's need and its cards the same way.
"""

from __future__ import annotations

import functools

from gpusched.core.units import format_size
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import WaitingJob


def need(job: WaitingJob) -> str:
    """What a job asks for, in words."""
    return _need(job.mem_bytes, job.gpu_count)


@functools.lru_cache(maxsize=4096)  # a pass says it for thousands of jobs of few sizes
def _need(mem_bytes: int | None, gpu_count: int) -> str:
    if mem_bytes is None:
        return "a whole GPU" if gpu_count == 1 else f"{gpu_count} whole GPUs"
    size = format_size(mem_bytes)
    if gpu_count == 1:
        return f"{size} on 1 GPU"
    return f"{size} on each of {gpu_count} GPUs"


def gpu_name(gpu: PlanGpu, several_nodes: bool) -> str:
    if several_nodes and gpu.slot.node:
        return f"GPU {gpu.slot.index} on {gpu.slot.node}"
    return f"GPU {gpu.slot.index}"


def card_list(indices: list[int]) -> str:
    """ "GPU 1" or "GPUs 0, 3"."""
    names = ", ".join(map(str, indices))
    return f"GPU {names}" if len(indices) == 1 else f"GPUs {names}"


# The most job ids a reason lists: it is one line of `status`.
SHOWN_JOBS = 5


def job_list(ids: list[int], kind: str = "") -> str:
    """ "job 3", "busy jobs 3, 4", "jobs 1, 2, 3, 4, 5 and 13 more" (`kind`: "busy ")."""
    if len(ids) == 1:
        return f"{kind}job {ids[0]}"
    shown = ", ".join(map(str, ids[:SHOWN_JOBS]))
    more = f" and {len(ids) - SHOWN_JOBS} more" if len(ids) > SHOWN_JOBS else ""
    return f"{kind}jobs {shown}{more}"
