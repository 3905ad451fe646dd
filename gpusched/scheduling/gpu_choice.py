"""Rules 2 to 5 of the policy (see policy.py): which of the GPUs a job fits on now it gets.

Pure. `plan()` hands over the cards a job could start on now (its memory fits, the card
is open to it, and no head's claim forbids it: rule 1 is the plan's); this module picks
among them, each rule narrowing the choice only while enough cards are left for the job:

2. Keep the big cards for big jobs: prefer the cards that fewer waiting larger jobs
   could ever use (`Needs`), so a small job does not take the only cards a larger one
   fits on.
3. Contention (`pack: contention`): prefer the cards whose jobs' demands plus this
   job's stay within one card's busy time (`quiet`), of those the ones with no busy job;
   `contention_wait` says whether a job should rather wait for a quieter card (a busy one
   when every card it fits is busy already, `is_busy_card`; a light one when none stays
   quiet with it; one of unknown demand only when every card is full, `is_full_card`);
   with none quiet, a job that does not wait (unknown demand, --share) takes a card not
   busy yet, then the least loaded (`_least_contended`).
4. A multi-GPU job's set: the tightest by topology (lowest common ancestor level of
   `nvmlDeviceGetTopologyCommonAncestor`; cards on different nodes never mix).
5. The most available memory first (`placement: most-free`, the default) or the least
   that still fits (`placement: best-fit`), ties to the lower index.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING

from gpusched.scheduling.gpu_budget import BUSY_DEMAND, PlanGpu, job_demand

if TYPE_CHECKING:
    from gpusched.scheduling.policy import WaitingJob

PLACEMENTS = ("most-free", "best-fit")
PACKS = ("contention", "memory")

# Rule 4: NVML's common-ancestor levels (0 the same board ... 50 across CPU sockets);
# cards with no reading count as the farthest.
UNKNOWN_LEVEL = 60

# A whole-GPU job (no --mem) needs a card nearly free of other processes: at most this
# share of it held by processes gpusched did not start (a display, a stray notebook).
WHOLE_GPU_OTHERS_MAX = 0.10

Topology = Mapping[str, Mapping[str, int]]  # uuid -> uuid -> common ancestor level

_mem = attrgetter("mem_bytes")


def nearly_free(gpu: PlanGpu) -> bool:
    """Whether a whole-GPU job may start here: no gpusched job, others hold little."""
    slot = gpu.slot
    if gpu.job_count != 0:
        return False
    return slot.total_bytes - slot.free_bytes <= WHOLE_GPU_OTHERS_MAX * slot.total_bytes


def fits_now(job: WaitingJob, gpu: PlanGpu) -> bool:
    """Whether `job` could start on this open card now, by memory (rule 1's budget)."""
    if job.gpu_keys is not None and gpu.slot.uuid not in job.gpu_keys:
        return False
    if job.mem_bytes is None:
        return nearly_free(gpu)
    if job.exclusive and gpu.job_count != 0:
        return False
    return gpu.available >= job.mem_bytes


class Needs:
    """The per-GPU memory of the jobs still waiting in a plan (rule 2), sorted."""

    def __init__(self, waiting: Sequence[WaitingJob], gpus: Sequence[PlanGpu]) -> None:
        self._waiting = waiting
        self._sorted: list[int] | None = None  # sorted when first asked (`_sizes`)
        self._placed: list[int] = []  # removed before then
        # Cards that could all ever hold the same: rule 2 cannot tell them apart.
        self.uniform = len({g.potential for g in gpus if g.slot.usable}) <= 1

    @property
    def _sizes(self) -> list[int]:
        # Sorted only when rule 2 asks (never while the cards are uniform): a long queue's
        # sort is a plan's largest single step.
        if self._sorted is None:
            self._sorted = sorted([m for m in map(_mem, self._waiting) if m is not None])
            for mem_bytes in self._placed:
                self._drop(mem_bytes)
        return self._sorted

    @property
    def count(self) -> int:
        return len(self._sizes)

    def remove(self, mem_bytes: int | None) -> None:
        if mem_bytes is None:
            return
        if self._sorted is None:
            self._placed.append(mem_bytes)
        else:
            self._drop(mem_bytes)

    def _drop(self, mem_bytes: int) -> None:
        sizes = self._sizes
        at = bisect.bisect_left(sizes, mem_bytes)
        if at < len(sizes) and sizes[at] == mem_bytes:
            del sizes[at]

    def larger(self, mem_bytes: int | None) -> int:
        """Where the sizes larger than `mem_bytes` start (len: none is larger)."""
        if mem_bytes is None:
            return len(self._sizes)
        return bisect.bisect_right(self._sizes, mem_bytes)

    def served(self, start: int, gpu: PlanGpu) -> int:
        """How many waiting jobs larger (from `start`, see `larger`) could ever fit here."""
        return max(0, bisect.bisect_right(self._sizes, gpu.potential) - start)


def is_busy_job(job: WaitingJob) -> bool:
    """A job known to keep a card busy (at least BUSY_DEMAND alone, not --share)."""
    return not job.share and job.demand is not None and job.demand >= BUSY_DEMAND


def is_busy_card(gpu: PlanGpu) -> bool:
    """Rule 3b: a card already busy: its jobs together keep it at least half busy (one
    busy job, or light ones that add up; an unknown demand counts as busy)."""
    return gpu.demand >= BUSY_DEMAND - 1e-9


def quiet(job: WaitingJob, gpu: PlanGpu) -> bool:
    """Rule 3: this card's jobs and this one stay within one card's busy time."""
    return gpu.demand + job_demand(job.demand, job.share) <= 1.0 + 1e-9


def is_full_card(gpu: PlanGpu) -> bool:
    """Rule 3c: its jobs' known demands pass one card's busy time already: no job, however
    light, stays quiet there. (Jobs of unknown demand count for nothing here: where no
    demand is measured, as on a driver without utilization readings, nothing is full.)"""
    return gpu.measured > 1.0 + 1e-9


def contention_wait(job: WaitingJob, candidates: Sequence[PlanGpu]) -> bool:
    """Whether a job should wait rather than start where it slows others and is slowed
    (rule 3c; the plan keeps the first such job's cards, so it starts once their jobs
    end), when fewer of the cards it fits on than it needs are: for a busy job, not busy
    already (`is_busy_card`); for a light one, quiet with it (`quiet`); for one of unknown
    demand, not full (`is_full_card`): where every card is full a job of any demand would
    wait, so it does not wait because its demand is unknown (issue 25: it never does). A
    job its owner marked `--share` never waits for this."""
    if job.share:
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
        if job.share or job.mem_bytes is None or not (job.demand is None or is_busy_job(job)):
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
    """Rule 3c: the cards `job` may start on rather than wait (see `contention_wait`)."""
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
    if job.share or (job.demand is not None and job.demand < BUSY_DEMAND):
        calm = cards
    else:
        calm = _narrow(cards, [g for g in cards if not is_full_card(g)], count)
        calm = _narrow(calm, [g for g in calm if not is_busy_card(g)], count)
    least = sorted(g.demand for g in calm)[count - 1]
    return [g for g in calm if g.demand <= least + 1e-9]


def _narrow(cards: list[PlanGpu], keep: list[PlanGpu], count: int) -> list[PlanGpu]:
    return keep if len(keep) >= count else cards


def choose_gpus(
    job: WaitingJob,
    candidates: Sequence[PlanGpu],
    needs: Needs,
    *,
    placement: str = "most-free",
    pack: str = "contention",
    topology: Topology | None = None,
    ordered: bool = False,
) -> list[PlanGpu] | None:
    """Rules 2 to 5: the GPUs `job` starts on among `candidates` (each fits it now).

    `ordered`: the candidates come in rule 5's most-free order already (the plan's room
    is kept sorted so), which spares a sort per placement in a long pass."""
    count = job.gpu_count
    cards = list(candidates)
    if len(cards) < count:
        return None
    start = None if needs.uniform else needs.larger(job.mem_bytes)
    if start is not None and start < needs.count:  # rule 2: cards differ, a larger job waits
        served = {g.slot.uuid: needs.served(start, g) for g in cards}
        if len(set(served.values())) > 1:
            least = sorted(served.values())[count - 1]
            cards = [g for g in cards if served[g.slot.uuid] <= least]
    in_order = ordered and placement == "most-free"
    if pack == "contention":  # rule 3 (`quiet`, inlined: it runs for every card)
        room_for = 1.0 + 1e-9 - job_demand(job.demand, job.share)
        quiet_cards = [g for g in cards if g.demand <= room_for]
        if len(quiet_cards) >= count:
            # Among quiet cards, those with no busy job first: a job that waits on data
            # beside a busy one has its bursts stretched (FIELD.md's C+S row).
            cards = _narrow(quiet_cards, [g for g in quiet_cards if not g.busy_with], count)
        else:
            cards = _least_contended(job, cards, count)
    if placement == "best-fit":  # rule 5's order
        cards.sort(key=lambda g: (g.available, g.slot.index))
    elif not in_order:
        cards.sort(key=lambda g: (-g.available, g.slot.index))
    if count == 1:
        return cards[:1]
    return _tightest(cards, count, topology)


def _level(topology: Topology | None, a: PlanGpu, b: PlanGpu) -> int:
    if topology is None:
        return UNKNOWN_LEVEL
    return topology.get(a.slot.uuid, {}).get(b.slot.uuid, UNKNOWN_LEVEL)


def _tightest(cards: list[PlanGpu], count: int, topology: Topology | None) -> list[PlanGpu] | None:
    """Rule 4: of `cards` (in rule 5's order), the `count` on one node that sit closest
    together; among equally tight sets, the one whose worst card comes first in rule 5's
    order (as a prefix of that order would be), then the one whose best card does."""
    rank = {id(g): i for i, g in enumerate(cards)}
    best: list[PlanGpu] | None = None
    best_score = (UNKNOWN_LEVEL + 1, 0, 0)
    for anchor in cards:
        others = sorted(
            (
                (_level(topology, anchor, other), rank[id(other)], other)
                for other in cards
                if other is not anchor and other.slot.node == anchor.slot.node
            ),
            key=lambda t: (t[0], t[1]),
        )
        if len(others) < count - 1:
            continue
        chosen = sorted(
            [anchor, *(o for _, _, o in others[: count - 1])], key=lambda g: rank[id(g)]
        )
        tightness = max(
            _level(topology, a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]
        )
        score = (tightness, rank[id(chosen[-1])], rank[id(chosen[0])])
        if best is None or score < best_score:
            best, best_score = chosen, score
        if topology is None:
            break  # no reading: rule 5's order alone
    return best
