"""`max_jobs_per_gpu` and `busy_util`: whether a card takes a new job at all.

A card lost or excluded, running a whole-GPU or an `--exclusive` job, running
`max_jobs_per_gpu` jobs already, or loaded at or above `busy_util` percent (budget's
`compute_load`) takes no new job, whatever its size (`is_open`); a job that would have
room on such a card is told which and why (`closed_reason`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.words import gpu_name, need


def is_open(gpu: PlanGpu, max_jobs_per_gpu: int | None, busy_util: float | None) -> bool:
    """Whether a GPU may take a new job at all, whatever its size."""
    if not gpu.slot.usable or gpu.whole or gpu.exclusive:
        return False
    if max_jobs_per_gpu is not None and gpu.job_count >= max_jobs_per_gpu:
        return False
    return busy_util is None or gpu.load < busy_util


def closed_reason(
    job: WaitingJob,
    free: Sequence[PlanGpu],
    *,
    busy_util: float | None,
    max_jobs_per_gpu: int | None,
    several_nodes: bool,
    behind: str,
) -> str | None:
    """Why `job` does not start on the `free` cards that would have room for it: too busy,
    or running `max_jobs_per_gpu` jobs already; None: neither holds it back."""
    if busy_util is not None:
        busy = [g for g in free if g.load >= busy_util and _memory_fits(job, g)]
        if busy:
            loads = ", ".join(f"{gpu_name(g, several_nodes)} at {g.load:.0f} %" for g in busy)
            return (
                f"needs {need(job)}; the GPUs with room for it are busy"
                f" (compute load {loads}; busy_util {busy_util:g} %){behind}"
            )
    cap = max_jobs_per_gpu
    if cap is not None:
        full = [g for g in free if g.job_count >= cap and _memory_fits(job, g)]
        if full:
            names = ", ".join(gpu_name(g, several_nodes) for g in full)
            return (
                f"needs {need(job)}; {names} would have room but already"
                f" run{'s' if len(full) == 1 else ''} {cap} job(s) (max_jobs_per_gpu {cap}){behind}"
            )
    return None


def _memory_fits(job: WaitingJob, gpu: PlanGpu) -> bool:
    if job.mem_bytes is None:
        return not gpu.whole and gpu.job_count == 0
    return not gpu.whole and gpu.available >= job.mem_bytes
