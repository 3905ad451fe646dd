"""The head's claim: the cards kept for the blocked head, and backfill.

The head is the first job in the plan's order that cannot start now. It claims
the card(s) expected to free soonest for it: on each card, the jobs it must wait for
are those whose end gives it room, ending first those whose `--time` runs out first
(then the largest), or every gpusched job there for a whole-GPU or `--exclusive` head
(it needs the card with none); a card's expected time is the latest of those ends
(unknown when one has no --time), and among cards equally soon the one with the least
memory still to free comes first. The claim is stored by the scheduler and handed back to the next
plan, which keeps it while the same job is head (so the wait is never restarted).

Jobs behind the head may still start on a kept card (backfill) when
- memory: the head still fits there at the first moment it would have without them,
  whatever order the card's jobs end in (`slack`, `_least_slack`; never beside a
  whole-GPU or `--exclusive` head, which waits for every job there), or
- time: the job's own `--time` ends before the head's earliest start (as Slurm does).
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.units import format_duration
from gpusched.scheduling.policy.budget import PlanGpu, could_ever_fit
from gpusched.scheduling.policy.data import HeadClaim, WaitingJob
from gpusched.scheduling.policy.words import card_list, job_list


@dataclass
class KeptCard:
    gpu: PlanGpu
    waits_for: list[int]  # the jobs on it that must end before the head fits
    free_in_s: float | None  # when they end by their --time; None: one has no limit
    to_free: int  # memory that must still be freed for the head
    slack: int | None  # what jobs behind may take, never delaying it; None: nothing


def kept_card(gpu: PlanGpu, mem_bytes: int | None, alone: bool = False) -> KeptCard | None:
    """What a head of `mem_bytes` per GPU waits for on this card; None: it never fits.
    `alone` (`--exclusive`): it needs the card with no gpusched job, as a whole GPU does."""
    if not gpu.slot.usable or not could_ever_fit(gpu, mem_bytes):
        return None
    # End first what ends first by its --time, then the oldest: jobs started beside the
    # head since it claimed the card (backfill) are newer, so a kept claim waits for the
    # same jobs from one plan to the next.
    order = sorted(gpu.holds, key=lambda h: (h[2] is None, h[2] or 0.0, h[0]))
    waited: list[tuple[int, int | None, float | None]] = []
    if mem_bytes is None or alone:
        # Every gpusched job on it ends first: no job may join by memory (its room is
        # not what the head waits for), only one that ends before the head could start.
        waited = order
        to_free = gpu.potential - gpu.available
    else:
        remaining = list(order)
        after = _room_after(gpu, remaining)
        to_free = max(0, mem_bytes - gpu.available)
        while after < mem_bytes and remaining:
            waited.append(remaining.pop(0))
            after = _room_after(gpu, remaining)
        if after < mem_bytes:
            return None
    times = [h[2] for h in waited]
    free_in = None if any(t is None for t in times) else max((t or 0.0 for t in times), default=0.0)
    slack = None if mem_bytes is None or alone or gpu.whole else _least_slack(gpu, mem_bytes)
    return KeptCard(gpu, [h[0] for h in waited], free_in, to_free, slack)


# Subsets of a card's jobs looked at for the slack; past this, no memory backfill there.
_MAX_SUMS = 4096


def _least_slack(gpu: PlanGpu, mem_bytes: int) -> int:
    """What a job behind the head may take on this card and never delay it, whatever order
    the card's jobs end in: the head starts at the first moment the jobs ended so far give
    it room, so what is left over must stay above every such moment's excess. The least
    excess over all sets of ended jobs that give it room (0: nothing may join)."""
    deficit = mem_bytes - gpu.available
    if deficit <= 0:
        return -deficit
    holds = [h[1] for h in gpu.holds if h[1] is not None]
    short = {0}  # sums of ended jobs' holds still under the deficit
    least: int | None = None
    for hold in holds:
        for total in list(short):
            reached = total + hold
            if reached >= deficit:
                least = reached - deficit if least is None else min(least, reached - deficit)
            else:
                short.add(reached)
        if len(short) > _MAX_SUMS:
            return 0
    return least or 0


def _room_after(gpu: PlanGpu, remaining: list[tuple[int, int | None, float | None]]) -> int:
    """A card's available memory once every job not in `remaining` has ended."""
    if any(h[1] is None for h in remaining):
        return 0
    held = sum(h[1] or 0 for h in gpu.holds)
    still = sum(h[1] or 0 for h in remaining)
    if gpu.whole:  # the whole-GPU job has ended: the card's potential, less who stays
        return gpu.potential - still
    return gpu.available + held - still


def soonest_first(card: KeptCard) -> tuple[bool, float, int, int]:
    return (card.free_in_s is None, card.free_in_s or 0.0, card.to_free, card.gpu.slot.index)


@dataclass
class Kept:
    """The head's claim in one plan: its cards and what may backfill beside it."""

    job: WaitingJob
    cards: dict[str, KeptCard]  # by uuid
    starts_in_s: float | None = None  # its earliest start by the --time ends; None: unknown

    def __post_init__(self) -> None:
        times = [c.free_in_s for c in self.cards.values()]
        self.starts_in_s = None if any(t is None for t in times) else max(t or 0.0 for t in times)

    @property
    def waits_for(self) -> list[int]:
        """The jobs the head waits for to end, on all its cards."""
        return sorted({j for c in self.cards.values() for j in c.waits_for})

    @property
    def claim(self) -> HeadClaim:
        return HeadClaim(self.job.job_id, tuple(self.cards), self.job.mem_bytes)

    def backfill(self, job: WaitingJob, gpu: PlanGpu) -> str | None:
        """How `job` may start on kept card `gpu` without delaying the head: "time",
        "memory", or None (it may not). The caller has checked it fits now."""
        card = self.cards[gpu.slot.uuid]
        start = self.starts_in_s
        if job.time_limit_s is not None and start is not None and job.time_limit_s <= start:
            return "time"
        if job.mem_bytes is not None and card.slack is not None and job.mem_bytes <= card.slack:
            return "memory"
        return None

    def took(self, job: WaitingJob, gpu: PlanGpu, how: str) -> None:
        card = self.cards[gpu.slot.uuid]
        if how == "memory" and card.slack is not None and job.mem_bytes is not None:
            card.slack -= job.mem_bytes

    def reason(self, several_nodes: bool) -> str:
        """The head's waiting reason: which cards are kept for it, and for which jobs."""
        cards = sorted(self.cards.values(), key=lambda c: c.gpu.slot.index)
        where = card_list([c.gpu.slot.index for c in cards])
        node = cards[0].gpu.slot.node
        if several_nodes and node:
            where += f" on {node}"
        waits = self.waits_for
        if not waits:
            # Room enough, but a cap on the card (max_jobs_per_gpu, busy_util) holds it:
            # it starts when a job there ends, whichever.
            on = sorted({h[0] for c in cards for h in c.gpu.holds})
            kept = f"{where} kept for it (job {self.job.job_id})"
            if not on:
                return kept
            which = job_list(on) if len(on) == 1 else f"one of {job_list(on)}"
            return f"{kept}: starts when {which} ends"
        start = self.starts_in_s
        eta = "" if start is None else f" (by --time, within {format_duration(start)})"
        ends = "ends" if len(waits) == 1 else "end"
        return f"{where} kept for it: starts when {job_list(waits)} {ends}{eta}"


def keep_for(
    job: WaitingJob,
    state: list[PlanGpu],
    stored: HeadClaim | None,
    several_nodes: bool,
) -> Kept | None:
    """The head's claim: the stored one while it still holds, else the cards that free
    soonest (on one node); None when no cards could ever hold it."""
    by_uuid = {g.slot.uuid: g for g in state}
    if stored is not None and stored.job_id == job.job_id and stored.mem_bytes == job.mem_bytes:
        again = [by_uuid.get(u) for u in stored.gpu_uuids]
        cards = [kept_card(g, job.mem_bytes, job.exclusive) for g in again if g is not None]
        if len(cards) == job.gpu_count and all(
            c is not None and (job.gpu_keys is None or c.gpu.slot.uuid in job.gpu_keys)
            for c in cards
        ):
            return Kept(job, {c.gpu.slot.uuid: c for c in cards if c is not None})
    options = [
        card
        for g in state
        if (job.gpu_keys is None or g.slot.uuid in job.gpu_keys)
        for card in [kept_card(g, job.mem_bytes, job.exclusive)]
        if card is not None
    ]
    options.sort(key=soonest_first)
    if several_nodes and job.gpu_count > 1:
        by_node: dict[str, list[KeptCard]] = {}
        for card in options:
            group = by_node.setdefault(card.gpu.slot.node, [])
            group.append(card)
            if len(group) == job.gpu_count:
                options = group
                break
        else:
            return None
    if len(options) < job.gpu_count:
        return None
    return Kept(job, {c.gpu.slot.uuid: c for c in options[: job.gpu_count]})
