"""Why a waiting job does not start now: the policy's reasons, true for each case.

Pure, split from policy.py. A reason names what holds the job back: too few usable GPUs,
the compute cap, `max_jobs_per_gpu`, other processes on a card a whole-GPU job needs,
a card kept for the head (rule 1), or the most memory any card has; in a cluster each
card is named with its node. Also the per-user memory cap (`limits:` max_mem): what a
job's GPUs count against it (`claimed_bytes`, `running_tallies`) and the reason when
it would pass it.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpusched.core.units import format_size
from gpusched.scheduling.gpu_budget import PlanGpu, RunningClaim
from gpusched.scheduling.gpu_choice import WHOLE_GPU_OTHERS_MAX

if TYPE_CHECKING:
    from gpusched.scheduling.head_claim import Kept
    from gpusched.scheduling.policy import UserCap, WaitingJob


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


@dataclass(frozen=True)
class Claims:
    """What the reasons need to know of the cards: built once per change, not per job."""

    usable_count: int
    free: list[PlanGpu]  # usable and kept for nobody
    behind: str  # "; GPU 1 kept for job N ahead of it", or ""
    max_jobs_per_gpu: int | None
    nodes: bool = False  # several nodes: a card is named with its node

    @classmethod
    def of(
        cls,
        gpus: list[PlanGpu],
        kept: Kept | None,
        max_jobs_per_gpu: int | None,
        several_nodes: bool = False,
        quiet_kept: Collection[str] = (),
    ) -> Claims:
        """`quiet_kept`: the cards kept for a job held for a quieter card (rule 3), which
        are no more available to the jobs behind it than the head's (`kept`)."""
        usable = [g for g in gpus if g.slot.usable]
        kept_uuids = set(kept.cards) if kept is not None else set()
        kept_uuids.update(quiet_kept)
        free = [g for g in usable if g.slot.uuid not in kept_uuids]
        behind = ""
        if kept is not None:
            cards = sorted(kept.cards.values(), key=_index)
            names = ", ".join(str(c.gpu.slot.index) for c in cards)
            where = f"GPU {names}" if len(cards) == 1 else f"GPUs {names}"
            if several_nodes and cards[0].gpu.slot.node:
                where += f" on {cards[0].gpu.slot.node}"
            behind = f"; {where} kept for job {kept.job.job_id} ahead of it"
        return cls(len(usable), free, behind, max_jobs_per_gpu, several_nodes)

    @functools.cached_property
    def most_available(self) -> str:
        """ "most available is 22.0G on GPU 1": the same for every job until a change."""
        best = _most_available(self.free)
        return f"most available is {format_size(best.available)} on {gpu_name(best, self.nodes)}"


def _index(card: object) -> int:
    return card.gpu.slot.index  # type: ignore[attr-defined]


def _most_available(gpus: Sequence[PlanGpu]) -> PlanGpu:
    return min(gpus, key=lambda g: (-g.available, g.slot.index))


def why_not(job: WaitingJob, claims: Claims, busy_util: float | None, several_nodes: bool) -> str:
    """Why `job` cannot start on any card now (the head's own reason is the claim's)."""
    if claims.usable_count < job.gpu_count:
        return f"needs {job.gpu_count} GPUs, {claims.usable_count} usable"
    free, behind = claims.free, claims.behind
    if busy_util is not None:
        busy = [g for g in free if g.load >= busy_util and _memory_fits(job, g)]
        if busy:
            loads = ", ".join(f"{gpu_name(g, several_nodes)} at {g.load:.0f} %" for g in busy)
            return (
                f"needs {need(job)}; the GPUs with room for it are busy"
                f" (compute load {loads}; busy_util {busy_util:g} %){behind}"
            )
    cap = claims.max_jobs_per_gpu
    if cap is not None:
        full = [g for g in free if g.job_count >= cap and _memory_fits(job, g)]
        if full:
            names = ", ".join(gpu_name(g, several_nodes) for g in full)
            return (
                f"needs {need(job)}; {names} would have room but already"
                f" run{'s' if len(full) == 1 else ''} {cap} job(s) (max_jobs_per_gpu {cap}){behind}"
            )
    if job.mem_bytes is None or job.exclusive:
        return _why_not_a_whole_card(job, free, behind, several_nodes)
    if not free:
        return f"needs {need(job)}{behind}"
    return f"needs {need(job)}, {claims.most_available}{behind}"


def _memory_fits(job: WaitingJob, gpu: PlanGpu) -> bool:
    if job.mem_bytes is None:
        return not gpu.whole and gpu.job_count == 0
    return not gpu.whole and gpu.available >= job.mem_bytes


def _why_not_a_whole_card(
    job: WaitingJob, free: list[PlanGpu], behind: str, several_nodes: bool
) -> str:
    """A whole-GPU or --exclusive job: a card with no gpusched job (and, for a whole GPU,
    nearly free of other processes)."""
    what = need(job) if job.mem_bytes is None else f"{need(job)} with --exclusive"
    empty = [g for g in free if g.job_count == 0]
    if not free:
        return f"needs {what}{behind}"
    if not empty:
        return f"needs {what}; every GPU it may use runs gpusched jobs{behind}"
    if job.mem_bytes is not None:
        best = _most_available(empty)
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


def claimed_bytes(mem_bytes: int | None, gpus: Sequence[PlanGpu]) -> int:
    """Declared memory a job holds over its GPUs; a whole GPU counts as its total."""
    return sum(g.slot.total_bytes if mem_bytes is None else mem_bytes for g in gpus)


def running_tallies(
    running: Sequence[RunningClaim], by_uuid: Mapping[str, PlanGpu]
) -> tuple[dict[str, int], dict[str, int], dict[int, int]]:
    """What the caps count of the jobs running: each user's jobs and declared memory
    (`claimed_bytes`), and each array's jobs."""
    user_running: dict[str, int] = {}
    user_bytes: dict[str, int] = {}
    array_running: dict[int, int] = {}
    for claim in running:
        user_running[claim.user] = user_running.get(claim.user, 0) + 1
        on = [by_uuid[u] for u in claim.gpu_uuids if u in by_uuid]
        user_bytes[claim.user] = user_bytes.get(claim.user, 0) + claimed_bytes(claim.mem_bytes, on)
        if claim.array_id is not None:
            array_running[claim.array_id] = array_running.get(claim.array_id, 0) + 1
    return user_running, user_bytes, array_running


def over_mem_cap(
    job: WaitingJob, cap: UserCap | None, held_bytes: int, chosen: Sequence[PlanGpu]
) -> str | None:
    if cap is None or cap.max_mem_bytes is None:
        return None
    wanted = claimed_bytes(job.mem_bytes, chosen)
    if held_bytes + wanted <= cap.max_mem_bytes:
        return None
    return (
        f"user limit: {job.user} holds {format_size(held_bytes)} of GPU memory and this job"
        f" needs {format_size(wanted)} (max_mem {format_size(cap.max_mem_bytes)})"
    )
