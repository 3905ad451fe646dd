"""`--exclusive` and whole-GPU jobs, and which cards a job fits on now by memory.

A whole-GPU job (no `--mem`) needs a card with no gpusched job and nearly free of other
processes (`nearly_free`); an `--exclusive` job needs a card with no gpusched job, which
then takes no other (budget's `PlanGpu.exclusive`, card_limits' `is_open`); any other job
needs its `--mem` available, on the cards it may use (`fits_now`). A whole-GPU or
`--exclusive` job that fits nowhere is told why (`alone_reason`). Pure.
"""

from __future__ import annotations

from gpusched.core.units import format_size
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.most_free import most_available
from gpusched.scheduling.policy.words import gpu_name, need

# A whole-GPU job (no --mem) needs a card nearly free of other processes: at most this
# share of it held by processes gpusched did not start (a display, a stray notebook).
WHOLE_GPU_OTHERS_MAX = 0.10


def nearly_free(gpu: PlanGpu) -> bool:
    """Whether a whole-GPU job may start here: no gpusched job, others hold little."""
    slot = gpu.slot
    if gpu.job_count != 0:
        return False
    return slot.total_bytes - slot.free_bytes <= WHOLE_GPU_OTHERS_MAX * slot.total_bytes


def fits_now(job: WaitingJob, gpu: PlanGpu) -> bool:
    """Whether `job` could start on this open card now, by memory (budget's `available`)."""
    if job.gpu_keys is not None and gpu.slot.uuid not in job.gpu_keys:
        return False
    if job.mem_bytes is None:
        return nearly_free(gpu)
    if job.exclusive and gpu.job_count != 0:
        return False
    return gpu.available >= job.mem_bytes


def alone_reason(job: WaitingJob, free: list[PlanGpu], behind: str, several_nodes: bool) -> str:
    """Why a whole-GPU or --exclusive job starts on none of the `free` cards: each runs a
    gpusched job, or (for a whole GPU) other processes hold too much of it."""
    what = need(job) if job.mem_bytes is None else f"{need(job)} with --exclusive"
    empty = [g for g in free if g.job_count == 0]
    if not free:
        return f"needs {what}{behind}"
    if not empty:
        return f"needs {what}; every GPU it may use runs gpusched jobs{behind}"
    if job.mem_bytes is not None:
        best = most_available(empty)
        return (
            f"needs {what}, most available on a GPU with no gpusched job is"
            f" {format_size(best.available)} on {gpu_name(best, several_nodes)}{behind}"
        )
    held = ", ".join(
        f"{gpu_name(g, several_nodes)} (other processes hold"
        f" {format_size(g.slot.total_bytes - g.slot.free_bytes, tabular=False)}"
        f" of {format_size(g.slot.total_bytes, tabular=False)})"
        for g in empty
    )
    return (
        f"needs {what}; the GPUs with no gpusched job are in use by other processes: {held};"
        f" a whole-GPU job needs one nearly free"
        f" (others at most {WHOLE_GPU_OTHERS_MAX:.0%}){behind}"
    )
