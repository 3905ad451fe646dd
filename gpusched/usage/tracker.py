"""What a job does with its GPUs, accumulated poll by poll. Pure: no I/O, no clock.

The scheduler keeps one `UsageTracker` per running job in memory and feeds it on every
poll: the memory the job's processes hold on each of its GPUs (as `attribution.held_bytes`
finds them) and the utilization of those GPUs (`job_utilization`). A tracker is a few
numbers (peak, count, sum, sum of squares, min, max), so a poll costs no database write;
the scheduler writes the figures when they matter (see `gpusched.usage.monitor`).

Also here, because it is a judgement on the same figures: `overrun_limit`, how far past
its declared memory a job may go before gpusched acts. Whether a job that failed ran out
of memory is gpusched.usage.oom's to say, from the tracker's `peak_mem` and `last_card`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpusched.usage.demand import CardPoll, DemandTracker

MiB = 2**20
GiB = 2**30


def overrun_limit(declared_bytes: int, margin_fraction: float, margin_bytes: int) -> int:
    """The most a job declared at `declared_bytes` per GPU may hold on one GPU."""
    return declared_bytes + math.floor(declared_bytes * margin_fraction) + margin_bytes


def job_utilization(
    pids_by_gpu: Mapping[str, Collection[int]],
    process_util: Mapping[str, Mapping[int, int]] | None,
    gpu_util: Mapping[str, int | None],
    alone_on: Collection[str] = (),
) -> float | None:
    """One job's GPU utilization (percent) at one poll: the mean over the GPUs it holds.

    On each GPU: the sum of its processes' SM utilization where the driver samples per
    process (`process_util[uuid]`: pid -> percent), else the whole GPU's utilization, which
    on a shared card also counts its neighbours. A job none of whose processes has a sample
    there is left out of this poll (on a busy shared card a process often gets none: it is
    not 0 %), unless it is alone on the card (`alone_on`: the card's figure is its own) or
    the card read idle (under IDLE_DEVICE_PERCENT: it ran nothing). None when nothing is known.
    """
    values: list[float] = []
    for uuid, pids in pids_by_gpu.items():
        per_pid = None if process_util is None else process_util.get(uuid)
        whole = gpu_util.get(uuid)
        if per_pid is not None:
            sampled = [per_pid[pid] for pid in pids if pid in per_pid]
            if sampled:
                values.append(float(min(100, sum(sampled))))
            elif whole is not None and uuid in alone_on:
                values.append(float(whole))
            elif whole is not None and whole < IDLE_DEVICE_PERCENT:
                values.append(0.0)
        elif whole is not None:
            values.append(float(whole))
    return sum(values) / len(values) if values else None


# A card whose own utilization reads under this ran (almost) nothing in the poll.
IDLE_DEVICE_PERCENT = 5


# The weight of the newest poll in a recent utilization: about the last four polls count.
# One poll alone is too jumpy to decide on (a training loop that waits for data reads 0 %
# now and 100 % a second later); the mean over the whole job too slow to follow a change.
RECENT_WEIGHT = 0.25


def smooth(previous: float | None, sample: float) -> float:
    """An exponentially weighted mean: `previous` moved RECENT_WEIGHT of the way to `sample`."""
    return sample if previous is None else previous + RECENT_WEIGHT * (sample - previous)


@dataclass
class UsageTracker:
    """One running job's memory and utilization so far."""

    peak_mem: int = 0  # bytes on its busiest GPU
    mem_samples: int = 0
    util_samples: int = 0
    util_sum: float = 0.0
    util_sumsq: float = 0.0
    util_min: float | None = None
    util_max: float | None = None
    util_recent: float | None = None  # weighted toward the last polls (RECENT_WEIGHT)
    # At the last memory sample: the job's card with the least free memory, as
    # gpusched.usage.oom.CardSeen's fields (index, free_bytes, total_bytes, held_bytes).
    last_card: dict[str, int] | None = None
    overrun_at: str | None = None  # when it was first seen over its declared memory + margin
    # Its demand (share of a card's busy time) and what sharing a busy card cost it.
    sharing: DemandTracker = field(default_factory=DemandTracker)
    mem_now: int = 0  # bytes on its busiest GPU at the last poll (`status`: in use beside declared)

    def observe_memory(
        self, per_gpu_bytes: Mapping[str, int], last_card: Mapping[str, int] | None = None
    ) -> bool:
        """Record one poll's memory; True when the peak rose."""
        self.mem_samples += 1
        self.last_card = None if last_card is None else dict(last_card)
        peak = max(per_gpu_bytes.values(), default=0)
        self.mem_now = peak
        if peak > self.peak_mem:
            self.peak_mem = peak
            return True
        return False

    def observe_util(self, percent: float) -> None:
        percent = min(100.0, max(0.0, float(percent)))
        self.util_samples += 1
        self.util_sum += percent
        self.util_sumsq += percent * percent
        self.util_min = percent if self.util_min is None else min(self.util_min, percent)
        self.util_max = percent if self.util_max is None else max(self.util_max, percent)
        self.util_recent = smooth(self.util_recent, percent)

    def observe_cards(self, polls: Iterable[CardPoll]) -> None:
        """One poll of each GPU it holds memory on: for its demand (gpusched.usage.demand)."""
        for poll in polls:
            self.sharing.observe(poll)

    @property
    def util_mean(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None

    @property
    def util_stddev(self) -> float | None:
        """Population standard deviation of the samples."""
        if not self.util_samples:
            return None
        mean = self.util_sum / self.util_samples
        return math.sqrt(max(0.0, self.util_sumsq / self.util_samples - mean * mean))

    def summary(self) -> dict[str, Any]:
        """The job's public figures (JSON fields and store columns)."""
        mean, spread = self.util_mean, self.util_stddev
        return {
            "peak_mem": self.peak_mem or None,
            "mean_util": None if mean is None else round(mean),
            "util_min": None if self.util_min is None else round(self.util_min),
            "util_max": None if self.util_max is None else round(self.util_max),
            "util_stddev": None if spread is None else round(spread, 1),
            "demand": self.sharing.demand(),
            "shared_with": list(self.sharing.shared_with),
            "sharing_speed": self.sharing.sharing_speed(),
        }

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> UsageTracker:
        """Rebuild from `to_state()`; unknown or missing keys are ignored (older daemons)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in (state or {}).items() if k in names}
        values["sharing"] = DemandTracker.from_state(values.get("sharing"))
        return cls(**values)
