"""Rule 3 of the policy (see policy.py): the GPUs a waiting job starts on now, on one node.

Pure. Split from policy.py: on one server the fast path (a prefix of the GPUs sorted by
room) is all there is; in a cluster a job may be restricted to some GPUs (`--node`, nodes
where its user exists) and a multi-GPU job's cards must all be on one server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpusched.scheduling.gpu_budget import PlanGpu

if TYPE_CHECKING:
    from gpusched.scheduling.policy import WaitingJob


def one_node(gpus: Sequence[PlanGpu], count: int) -> list[PlanGpu] | None:
    """The first `count` of `gpus` (in their order) that are on one node: a job's GPUs
    are on one server. In room order, the node reached first has the best N-th GPU."""
    by_node: dict[str, list[PlanGpu]] = {}
    for gpu in gpus:
        group = by_node.setdefault(gpu.slot.node, [])
        group.append(gpu)
        if len(group) == count:
            return group
    return None


def choose_gpus(
    job: WaitingJob,
    room: list[PlanGpu],
    fits_by_mem: dict[int | None, list[PlanGpu]],
    several_nodes: bool,
) -> list[PlanGpu] | None:
    """Rule 3: the GPUs `job` starts on now (most available first), or None."""
    if job.gpu_keys is not None:  # few jobs are restricted: no memo, a filtered copy
        keys = job.gpu_keys
        pool = [g for g in room if g.slot.uuid in keys]
        if job.mem_bytes is None:
            candidates = [g for g in pool if g.job_count == 0]
        else:
            mem = job.mem_bytes
            candidates = [g for g in pool if g.available >= mem]
    elif job.mem_bytes is None:
        memo = fits_by_mem.get(None)
        if memo is None:
            memo = fits_by_mem[None] = [g for g in room if g.job_count == 0]
        candidates = memo
    else:
        # `room` is sorted by available memory, most first: the GPUs this job fits on
        # are a prefix of it, and its first `gpu_count` are the ones rule 3 picks.
        enough = len(room) >= job.gpu_count
        fits = enough and room[job.gpu_count - 1].available >= job.mem_bytes
        candidates = room if fits else []
        if fits and several_nodes and job.gpu_count > 1:
            candidates = [g for g in room if g.available >= job.mem_bytes]
    if len(candidates) < job.gpu_count:
        return None
    if several_nodes and job.gpu_count > 1:
        return one_node(candidates, job.gpu_count)
    return candidates[: job.gpu_count]
