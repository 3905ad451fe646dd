"""Contention (`pack: contention`, the default; `pack: memory` skips it): busy jobs apart.

A job's demand is the share of a card's busy time it needs alone (measured while it runs,
else its history; budget's `job_demand`: unknown counts as busy, `--share` as light, and
what was measured of a job or its kind outranks `--share`). Two
busy jobs on one card each run at about half speed; jobs that wait on data pack almost
free (FIELD.md's table measured on an H200). So:

- Quiet first (`prefer_quiet`): a card whose jobs' demands plus this job's stay within
  100 % (`quiet`); among quiet cards, one with no busy job (a job that waits on data
  beside a busy one has its bursts stretched about 2x: FIELD.md's C+S row).
- A card already busy (`is_busy_card`): its jobs together keep it at least 50 % busy. A
  card full (`is_full_card`): its jobs' measured demands pass 100 % (a job not measured
  yet counts for nothing, one placed in this plan with no history as busy). No quiet
  card: a job of unknown demand takes a card not full, of those one not busy yet, then
  it or a `--share` job the least loaded card (`_least_contended`).
- Waiting for a quieter card (`contention_wait`, `CalmRoom` for a long queue): a busy job
  when every card it fits on is busy already; a light one when none stays quiet with it;
  one of unknown demand only where every card it fits on is full (it never waits because
  its demand is unknown); a `--share` job nothing measured says is busy never. The bound
  on that wait is module quieter's.
Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

from gpusched.scheduling.policy.budget import BUSY_DEMAND, PlanGpu, job_demand
from gpusched.scheduling.policy.data import WaitingJob

PACKS = ("contention", "memory")


def is_busy_job(job: WaitingJob) -> bool:
    """A job known to keep a card busy (at least BUSY_DEMAND alone, measured of it or its
    kind: `--share` does not make it light)."""
    return job.demand is not None and job.demand >= BUSY_DEMAND


def is_busy_card(gpu: PlanGpu) -> bool:
    """A card already busy: its jobs together keep it at least half busy (one
    busy job, or light ones that add up; an unknown demand counts as busy)."""
    return gpu.demand >= BUSY_DEMAND - 1e-9


def quiet(job: WaitingJob, gpu: PlanGpu) -> bool:
    """This card's jobs and this one stay within one card's busy time."""
    return gpu.demand + job_demand(job.demand, job.share) <= 1.0 + 1e-9


def is_full_card(gpu: PlanGpu) -> bool:
    """Its jobs' known demands pass one card's busy time already: no job, however
    light, stays quiet there. (Jobs of unknown demand count for nothing here: where no
    demand is measured, as on a driver without utilization readings, nothing is full.)"""
    return gpu.measured > 1.0 + 1e-9


def contention_wait(job: WaitingJob, candidates: Sequence[PlanGpu]) -> bool:
    """Whether a job should wait rather than start where it slows others and is slowed
    (the plan keeps the first such job's cards, module quieter, so it starts once their
    jobs end), when fewer of the cards it fits on than it needs are: for a busy job, not busy
    already (`is_busy_card`); for a light one, quiet with it (`quiet`); for one of unknown
    demand, not full (`is_full_card`): where every card is full a job of any demand would
    wait, so it does not wait because its demand is unknown (it never does). A
    job its owner marked `--share` never waits for this while nothing measured of its kind
    says otherwise (`light_by_word`)."""
    if job.light_by_word:
        return False
    # Enough such cards is all it asks: stop at the first `gpu_count` (a long queue of new
    # jobs asks this of every card of a big server).
    takes = filter(_calm_for(job), candidates)
    return len(list(islice(takes, job.gpu_count))) < job.gpu_count


class CalmRoom:
    """`contention_wait` for a long queue: the cards of the plan's room (open, unclaimed,
    most available first) that a job of unknown demand (not full) or a busy one (not busy)
    may start on rather than wait, listed once per change of the room instead of tested
    for each job. The plan clears it whenever the room or a card in it changes."""

    def __init__(self) -> None:
        self._calm: dict[bool, list[PlanGpu]] = {}  # unknown demand? -> its calm cards

    def clear(self) -> None:
        self._calm.clear()

    def wait(
        self, job: WaitingJob, found: Sequence[PlanGpu], room: Sequence[PlanGpu], prefix: int
    ) -> bool:
        """`contention_wait(job, found)` where `found` is the room's first `prefix` cards
        (every one with `available >= job.mem_bytes`: the room is sorted so) followed by
        cards from outside the room (the head's claimed cards it may backfill)."""
        if (
            job.light_by_word
            or job.mem_bytes is None
            or not (job.demand is None or is_busy_job(job))
        ):
            return contention_wait(job, found)  # a light job: its own demand decides
        unknown = job.demand is None
        calm = self._calm.get(unknown)
        if calm is None:
            calm = [g for g in room if not (is_full_card(g) if unknown else is_busy_card(g))]
            self._calm[unknown] = calm
        left = job.gpu_count
        for gpu in calm:  # in the room's order: those it fits on come first
            if gpu.available < job.mem_bytes:
                break
            left -= 1
            if left == 0:
                return False
        return len(list(islice(filter(_calm_for(job), found[prefix:]), left))) < left


def _calm_for(job: WaitingJob) -> Callable[[PlanGpu], bool]:
    """The cards `job` may start on rather than wait (see `contention_wait`)."""
    if job.demand is None:
        return lambda gpu: not is_full_card(gpu)
    if is_busy_job(job):
        return lambda gpu: not is_busy_card(gpu)
    return lambda gpu: quiet(job, gpu)


def _least_contended(job: WaitingJob, cards: list[PlanGpu], count: int) -> list[PlanGpu]:
    """No card stays quiet with this job (one of unknown demand, counted busy, or one
    marked --share, which never wait): one of unknown demand takes a card that is not
    full if there is one, of those one not busy yet (two busy jobs each run at half
    speed); then either takes the least loaded cards, where it disturbs least."""
    if job.light_by_word or (job.demand is not None and job.demand < BUSY_DEMAND):
        calm = cards
    else:
        calm = _narrow(cards, [g for g in cards if not is_full_card(g)], count)
        calm = _narrow(calm, [g for g in calm if not is_busy_card(g)], count)
    least = sorted(g.demand for g in calm)[count - 1]
    return [g for g in calm if g.demand <= least + 1e-9]


def _narrow(cards: list[PlanGpu], keep: list[PlanGpu], count: int) -> list[PlanGpu]:
    return keep if len(keep) >= count else cards


def prefer_quiet(job: WaitingJob, cards: list[PlanGpu], count: int) -> list[PlanGpu]:
    """Of `cards` (at least `count`), the quiet ones, of those the ones with no busy job;
    with too few quiet, where the job disturbs least (`_least_contended`)."""
    room_for = 1.0 + 1e-9 - job_demand(job.demand, job.share)  # `quiet`, inlined: every card
    quiet_cards = [g for g in cards if g.demand <= room_for]
    if len(quiet_cards) < count:
        return _least_contended(job, cards, count)
    return _narrow(quiet_cards, [g for g in quiet_cards if not g.busy_with], count)
