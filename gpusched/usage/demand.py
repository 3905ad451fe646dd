"""A job's GPU demand: the share of a card's busy time it would take alone (0.0-1.0). Pure.

What NVML gives (FIELD.md, "What NVML showed", measured on an H200): the device's
utilization (the share of time any kernel ran) and, per process, an SM figure that on a
shared card is the process's time slice. So a poll says something different by where the
job was:

- **Alone on its card** (no other process holds memory there): the device's utilization
  is the job's demand (a busy loop alone: device 98 %, a 3 %-busy loop: device 3 %).
- **Sharing a card that is not saturated** (device under BUSY_DEVICE_PERCENT): nobody
  waited for a turn, so the job's own per-process figure is its demand, when there is one.
- **Sharing a saturated card**: the jobs took turns. The job's own figure is the share of
  the card it obtained, not its demand (two busy loops: device 100 %, each 53-63 %). A
  poll with no sample for the job counts as a share of 0 (it got no turn), never as a
  demand of 0. Such polls tell what sharing cost the job, and only a lower bound on its
  demand.

Anywhere else a missing per-process sample says nothing (a light job often has none: 13
of 17 polls). `demand()` is the mean of the polls that read the demand (at least
MIN_DEMAND_POLLS of them); else, from a saturated card, 1.0 for a job that took at least
about its slice of it (it wanted the card: two busy jobs each obtain about half, and
recording that half as their demand would make the next run of either look light); for
one that took less, the most of the share it obtained, its slice of the busy time its busy
neighbours leave of the card, and its prior (what its kind's past runs demanded, which the
usage monitor sets from the history); else None. So a saturated card's readings never
lower a job's demand below what is known of it: a light job slowed there obtains less
than its demand and is often not sampled at all (twenty jobs of 0.10 on one card each
obtain 5 %, in the few polls that sample them), and reading that as its demand would
make the card look half empty and pack it further. `sharing_speed()` estimates how fast
the job ran while it took turns against alone: its share over its demand (FIELD.md's C+C
pair ran at 0.475x).

Each poll is judged on the device's figure of that poll, not a smoothed one: a smoothed
figure lags a job's start and end by several polls, which on a real H100
(benchmarks/real_card.py) makes a busy job alone read 0.72, two busy jobs sharing a card
read as unsaturated for most of their run (their halves recorded as demands, and one
told to fix its data loader), and a light job read 0.44 in the polls after its busy
neighbours end.

`card_polls` builds each job's CardPolls from one poll of the GPUs; the usage monitor feeds
them to the job's tracker (gpusched.usage.tracker) and reads `demand()` back for the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gpusched.core.models import GpuProcess, GpuState

# A card at least this busy is saturated: its jobs take turns (FIELD.md: two busy loops
# read 100 %, a busy and a light one 99 %; one busy loop alone 98 %). A job alone reads
# its demand whatever the figure, so this only judges shared cards.
BUSY_DEVICE_PERCENT = 95.0
MIN_DEMAND_POLLS = 3
# A neighbour taking at least this share of a saturated card in a poll is "also busy".
BUSY_NEIGHBOUR_PERCENT = 25.0
# Neighbours all under this (and the job's own figure within it of the device's): the
# card was busy with the job's own work, not theirs (two busy jobs split a poll as
# unevenly as 80/20: that is a time slice).
IDLE_NEIGHBOUR_PERCENT = 5.0
# Less than this fraction of a job's polls on a saturated shared card: sharing cost it
# nothing worth saying.
MIN_CONTENDED_FRACTION = 0.2


@dataclass(frozen=True)
class CardPoll:
    """One poll of one of the job's GPUs, as the usage monitor saw it."""

    gpu_index: int
    device_percent: float | None  # the whole card's utilization; None if not read
    own_percent: float | None  # the job's processes' per-process figure; None: no sample
    sampled: bool  # whether the driver samples per process at all on this card
    neighbours: Mapping[int, float | None]  # other jobs holding memory there -> their figure
    outsiders: bool = False  # processes gpusched did not start hold memory there


@dataclass
class DemandTracker:
    """What the polls so far say about one job's demand and what sharing cost it."""

    demand_sum: float = 0.0  # percent, over the polls that read the demand
    demand_polls: int = 0
    contended_share_sum: float = 0.0  # percent obtained on a saturated shared card
    contended_polls: int = 0
    polls: int = 0  # every poll of one of its cards with a device figure
    slice_sum: float = 0.0  # 100 / number of jobs on the card, over the contended polls
    # Over the contended polls, the card's busy time its busy neighbours' figures leave,
    # per job not among them (see _rest_slice).
    rest_slice_sum: float = 0.0
    shared_with: list[int] = field(default_factory=list)  # busy neighbours on saturated cards
    shared_gpus: list[int] = field(default_factory=list)  # where it took turns
    # What its kind's past runs demanded (0.0-1.0), None when nothing is known: a floor
    # under what its turns on a saturated card say, which only bound its demand from below.
    prior: float | None = None

    def observe(self, poll: CardPoll) -> None:
        if poll.device_percent is None:
            return
        self.polls += 1
        alone = not poll.neighbours and not poll.outsiders
        if alone:
            self._demand(poll.device_percent)
        elif poll.device_percent < BUSY_DEVICE_PERCENT or _busy_by_itself(poll):
            if poll.own_percent is not None:
                self._demand(poll.own_percent)
        elif poll.sampled:
            self.contended_polls += 1
            self.contended_share_sum += min(100.0, poll.own_percent or 0.0)
            self.slice_sum += 100.0 / (1 + len(poll.neighbours) + int(poll.outsiders))
            self.rest_slice_sum += _rest_slice(poll)
            if poll.gpu_index not in self.shared_gpus:
                self.shared_gpus.append(poll.gpu_index)
            for job_id, figure in poll.neighbours.items():
                busy = figure is not None and figure >= BUSY_NEIGHBOUR_PERCENT
                if busy and job_id not in self.shared_with:
                    self.shared_with.append(job_id)

    def _demand(self, percent: float) -> None:
        self.demand_polls += 1
        self.demand_sum += min(100.0, max(0.0, percent))

    def demand(self) -> float | None:
        """The job's demand, 0.0-1.0 (see the module's docstring), or None."""
        if self.demand_polls >= MIN_DEMAND_POLLS:
            return round(self.demand_sum / self.demand_polls / 100, 3)
        if self.contended_polls:
            share = self.contended_share_sum / self.contended_polls / 100
            return round(self._saturated_bound(share), 3)
        return None

    def _saturated_bound(self, share: float) -> float:
        """What its turns on a saturated card say of its demand, obtaining `share`: 1.0
        when it took about its slice (it wanted the card), else at least its slice and
        at least its prior. A light job slowed there gets less than its demand and often
        no sample at all; its slice of what the busy neighbours leave of the card (all of
        it beside light jobs only) makes the card's jobs together count as filling it,
        while a light job beside a busy one stays light."""
        if self._took_its_slice(share):
            return 1.0
        rest_slice = self.rest_slice_sum / self.contended_polls / 100
        return max(share, rest_slice, self.prior or 0.0)

    def _took_its_slice(self, share: float) -> bool:
        """On a saturated card, whether the job obtained about its turn's worth (what a job
        that wanted the whole card gets: two busy loops 53-63 % each, FIELD.md)."""
        fair_slice = self.slice_sum / self.contended_polls / 100
        return share >= 0.8 * fair_slice

    def measured_demand(self) -> float | None:
        """The demand read where it can be read (alone, or an unsaturated card), or None."""
        if self.demand_polls >= MIN_DEMAND_POLLS:
            return self.demand_sum / self.demand_polls / 100
        return None

    def contended_fraction(self) -> float:
        return self.contended_polls / self.polls if self.polls else 0.0

    def sharing_speed(self, known_demand: float | None = None) -> float | None:
        """Its speed while it took turns on a saturated card, against alone; None when
        that was too rare to say (under MIN_CONTENDED_FRACTION of its polls)."""
        if not self.contended_polls or self.contended_fraction() < MIN_CONTENDED_FRACTION:
            return None
        share = self.contended_share_sum / self.contended_polls / 100
        demand = self.measured_demand() if known_demand is None else known_demand
        if demand is None:
            demand = 1.0 if self._took_its_slice(share) else share
        if demand <= 0:
            return None
        return round(min(1.0, share / demand), 2)

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> DemandTracker:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (state or {}).items() if k in names})


def _busy_by_itself(poll: CardPoll) -> bool:
    """A saturated shared card that the job kept busy by itself in this poll: its own
    figure is about the device's and no neighbour took a busy share (a job swinging
    0-95 % beside an idle one peaks at 95 %: that is its demand, not a time slice)."""
    own = poll.own_percent
    if own is None or poll.device_percent is None or poll.outsiders:
        return False
    if poll.device_percent - own >= IDLE_NEIGHBOUR_PERCENT:
        return False
    return not any(
        figure is None or figure >= IDLE_NEIGHBOUR_PERCENT for figure in poll.neighbours.values()
    )


def _rest_slice(poll: CardPoll) -> float:
    """A saturated card's busy time (percent) that its busy neighbours' own figures do
    not account for, shared among the jobs that are not busy neighbours (this one too)."""
    device = poll.device_percent or 0.0
    busy = [f for f in poll.neighbours.values() if f is not None and f >= BUSY_NEIGHBOUR_PERCENT]
    others = 1 + len(poll.neighbours) - len(busy) + int(poll.outsiders)
    return max(0.0, device - sum(busy)) / others


def card_polls(
    by_uuid: Mapping[str, GpuState],
    processes: Mapping[int, Mapping[str, Sequence[GpuProcess]]],
    process_util: Mapping[str, Mapping[int, int]] | None,
    device_util: Mapping[str, float],
) -> dict[int, dict[str, CardPoll]]:
    """Each running job's view of its cards at this poll: the device's recent figure, its
    own per-process one, and the other jobs (with theirs) and outside processes there.

    `device_util` is each card's figure at this poll (see the module's docstring for why
    not a smoothed one). A poll where two swinging jobs happen to peak together reads as
    saturated: it counts towards what sharing cost them only where such polls are a good
    part of their run (MIN_CONTENDED_FRACTION here, the hints' own fractions).
    """
    own: dict[int, dict[str, float | None]] = {}
    holders: dict[str, list[int]] = {}
    ours: dict[str, set[int]] = {}
    for job_id, per_gpu in processes.items():
        for uuid, procs in per_gpu.items():
            samples = None if process_util is None else process_util.get(uuid)
            sampled = [samples[p.pid] for p in procs if samples and p.pid in samples]
            own.setdefault(job_id, {})[uuid] = float(sum(sampled)) if sampled else None
            holders.setdefault(uuid, []).append(job_id)
            ours.setdefault(uuid, set()).update(p.pid for p in procs)
    polls: dict[int, dict[str, CardPoll]] = {}
    for job_id, figures in own.items():
        for uuid, figure in figures.items():
            gpu = by_uuid.get(uuid)
            if gpu is None:
                continue
            outsiders = any(
                (p.used_bytes or 0) > 0 and p.pid not in ours[uuid] for p in gpu.processes
            )
            polls.setdefault(job_id, {})[uuid] = CardPoll(
                gpu_index=gpu.index,
                device_percent=device_util.get(uuid),
                own_percent=figure,
                sampled=process_util is not None and uuid in process_util,
                neighbours={j: own[j][uuid] for j in holders[uuid] if j != job_id},
                outsiders=outsiders,
            )
    return polls


def typical_demand(recorded: Sequence[float]) -> float | None:
    """A job's expected demand from its past runs' recorded demands: their median."""
    values = sorted(recorded)
    if not values:
        return None
    middle = len(values) // 2
    median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    return round(median, 3)
