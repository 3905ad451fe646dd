"""What a job does with its GPUs, accumulated poll by poll. Pure: no I/O, no clock.

The scheduler keeps one `UsageTracker` per running job in memory and feeds it on every
poll: the memory the job's processes hold on each of its GPUs (as `attribution.held_bytes`
finds them) and the utilization of those GPUs (`job_utilization`). A tracker is a few
numbers (peak, count, sum, sum of squares, min, max), so a poll costs no database write;
the scheduler writes the figures when they matter (see `gpusched.usage.monitor`).

Also here, because they are judgements on the same figures:

- `at_card_limit`: a GPU with (almost) no free memory left. A job that dies while one
  of its cards sits there most likely ran out of memory, even if its log does not say so.
- `oom_in_log`: the out-of-memory messages of PyTorch, TensorFlow and JAX at the end of a
  log.
- `overrun_limit`: how far past its declared memory a job may go before gpusched acts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

MiB = 2**20
GiB = 2**30

# A card is "at its limit" when what is free is under 2 % of it, and never less than
# 256 MiB: a framework that ran out of memory has typically failed to allocate a block of
# tens to hundreds of MiB, so what NVML still shows free is below that; 2 % keeps the rule
# meaningful on 80 GB cards, where allocator slack alone can be a GB.
AT_LIMIT_FRACTION = 0.02
AT_LIMIT_MIN_BYTES = 256 * MiB

# Where a log "ends": its last 40 non-empty lines (in at most its last 16 KiB). A Python
# traceback puts the error last, but launchers (torchrun's failure summary, TensorFlow's
# "Hint: ..." lines) print a few lines after it; an OOM that was caught and survived long
# before the end is not what killed the job.
OOM_TAIL_LINES = 40
OOM_TAIL_BYTES = 16 * 1024

OOM_PATTERN = re.compile(
    r"CUDA out of memory"  # PyTorch: "torch.OutOfMemoryError: CUDA out of memory. Tried to..."
    r"|torch\.(?:cuda\.)?OutOfMemoryError"
    r"|CUDA error: out of memory"  # cudaErrorMemoryAllocation, from any CUDA program
    r"|ResourceExhaustedError"  # TensorFlow
    r"|OOM when allocating"  # TensorFlow's message for it
    r"|RESOURCE_EXHAUSTED: Out of memory"  # JAX / XLA
)


def at_card_limit(free_bytes: int, total_bytes: int) -> bool:
    """True when a GPU has (almost) nothing left to allocate."""
    return free_bytes <= max(AT_LIMIT_MIN_BYTES, int(total_bytes * AT_LIMIT_FRACTION))


def oom_in_log(tail: str) -> str | None:
    """The out-of-memory line near the end of a log, or None."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines[-OOM_TAIL_LINES:]):
        if OOM_PATTERN.search(line):
            return line if len(line) <= 200 else line[:197] + "..."
    return None


def overrun_limit(declared_bytes: int, margin_fraction: float, margin_bytes: int) -> int:
    """The most a job declared at `declared_bytes` per GPU may hold on one GPU."""
    return declared_bytes + math.floor(declared_bytes * margin_fraction) + margin_bytes


def job_utilization(
    pids_by_gpu: Mapping[str, Collection[int]],
    process_util: Mapping[str, Mapping[int, int]] | None,
    gpu_util: Mapping[str, int | None],
) -> float | None:
    """One job's GPU utilization (percent) at one poll: the mean over the GPUs it holds.

    On each GPU: the sum of its processes' SM utilization where the driver samples per
    process (`process_util[uuid]`: pid -> percent; a GPU mapped to {} ran nothing since
    the last poll), else the whole GPU's utilization, which on a shared card also counts
    its neighbours. None when nothing is known.
    """
    values: list[float] = []
    for uuid, pids in pids_by_gpu.items():
        per_pid = None if process_util is None else process_util.get(uuid)
        if per_pid is not None:
            values.append(float(min(100, sum(per_pid.get(pid, 0) for pid in pids))))
        else:
            whole = gpu_util.get(uuid)
            if whole is not None:
                values.append(float(whole))
    return sum(values) / len(values) if values else None


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
    # At the last memory sample: the GPU it held that sat at its limit, described
    # ("GPU 0 had 50.0M of 24.0G free"), or None.
    at_limit: str | None = None
    overrun_at: str | None = None  # when it was first seen over its declared memory + margin
    mem_now: int = 0  # bytes on its busiest GPU at the last poll (`status`: in use beside declared)

    def observe_memory(self, per_gpu_bytes: Mapping[str, int], at_limit: str | None) -> bool:
        """Record one poll's memory; True when the peak rose."""
        self.mem_samples += 1
        self.at_limit = at_limit
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
        }

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> UsageTracker:
        """Rebuild from `to_state()`; unknown or missing keys are ignored (older daemons)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (state or {}).items() if k in names})
