"""Why a waiting job starts on no card now, in words true for each case.

A reason names what holds the job back: too few usable GPUs, the compute cap or
`max_jobs_per_gpu` on the cards with room (card_limits), a whole-GPU or `--exclusive`
job's want of an empty card (exclusive), a card kept for the head, or the most memory any
card has; in a cluster each card is named with its node. What the reasons need to know
of the cards (`Claims`) is built once per change of the cards, not once per job. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass

from gpusched.core.units import format_size
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.card_limits import closed_reason
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.exclusive import alone_reason
from gpusched.scheduling.policy.head_claim import Kept
from gpusched.scheduling.policy.most_free import most_available
from gpusched.scheduling.policy.words import card_list, gpu_name, need


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
        """`quiet_kept`: the cards kept for a job held for a quieter card (module
        quieter), which are no more available to the jobs behind it than the head's."""
        usable = [g for g in gpus if g.slot.usable]
        kept_uuids = set(kept.cards) if kept is not None else set()
        kept_uuids.update(quiet_kept)
        free = [g for g in usable if g.slot.uuid not in kept_uuids]
        behind = ""
        if kept is not None:
            cards = sorted(kept.cards.values(), key=lambda c: c.gpu.slot.index)
            where = card_list([c.gpu.slot.index for c in cards])
            if several_nodes and cards[0].gpu.slot.node:
                where += f" on {cards[0].gpu.slot.node}"
            behind = f"; {where} kept for job {kept.job.job_id} ahead of it"
        return cls(len(usable), free, behind, max_jobs_per_gpu, several_nodes)

    @functools.cached_property
    def most_available(self) -> str:
        """ "most available is 22.0G on GPU 1": the same for every job until a change."""
        best = most_available(self.free)
        return f"most available is {format_size(best.available)} on {gpu_name(best, self.nodes)}"


def why_not(job: WaitingJob, claims: Claims, busy_util: float | None, several_nodes: bool) -> str:
    """Why `job` cannot start on any card now (the head's own reason is the claim's)."""
    if claims.usable_count < job.gpu_count:
        return f"needs {job.gpu_count} GPUs, {claims.usable_count} usable"
    free, behind = claims.free, claims.behind
    if busy_util is not None or claims.max_jobs_per_gpu is not None:
        closed = closed_reason(
            job,
            free,
            busy_util=busy_util,
            max_jobs_per_gpu=claims.max_jobs_per_gpu,
            several_nodes=several_nodes,
            behind=behind,
        )
        if closed is not None:
            return closed
    if job.mem_bytes is None or job.exclusive:  # it needs a card with no gpusched job
        return alone_reason(job, free, behind, several_nodes)
    if not free:
        return f"needs {need(job)}{behind}"
    return f"needs {need(job)}, {claims.most_available}{_taken_by_outsider(job, claims)}{behind}"


def _taken_by_outsider(job: WaitingJob, claims: Claims) -> str:
    """ "; on GPU 0 pid 4242 (user bob), not started by gpusched, holds 30.0G" where such
    a process takes the room the job would have on the card named: it is what it waits
    for. Its pid and owner only, never its command line (another user's arguments)."""
    best = most_available(claims.free)
    other = best.slot.outsider
    if other is None or job.mem_bytes is None or best.available + other[2] < job.mem_bytes:
        return ""
    pid, owner, held = other
    return (
        f"; on {gpu_name(best, claims.nodes)} pid {pid} (user {owner}), which gpusched did"
        f" not start, holds {format_size(held)}"
    )
