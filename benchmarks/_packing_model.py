"""The packing benchmark's sharing model: how fast each job runs on a card it shares.

Fitted to what was measured on a real NVIDIA H200 (../shared/FIELD.md, "Measured on a
real card"; `MEASURED` below). A job is described by its demand (the share of a card's
time it keeps busy when alone, 0-1) and whether it is memory-bound. For the jobs on one
card, `speeds()` gives each one's speed relative to the same job alone, in three steps:

1. Time-slicing. A job alternates between GPU work (a share d of its solo time) and
   waiting (1 - d). Without MPS, processes on one card take equal turns, so while a job
   computes it gets 1 / (1 + N) of the card, N the number of others computing then
   (independent of each other, each pending a share a_j of the time). Its GPU work
   stretches by k = 1 / E[1 / (1 + N)], its speed is 1 / ((1 - d) + d k), and it is
   pending a = d k x speed of the time: solved as a fixed point. A busy job beside one
   that waits on data loses only what that one uses; a job that waits on data beside a
   busy one has its bursts stretched 2x; two busy jobs each run at half speed.
2. The card is work-conserving: the jobs together use it exactly while any of them has
   work pending (1 - prod(1 - a_j)); the speeds are scaled to that (none above 1).
3. Costs of sharing beyond that: a job that waits between bursts pays a context switch
   each time it resumes, `SWITCH_COST` x (1 - d) x log2(jobs on the card) (two 4 %-busy
   loops lost 1.3 % each, four lost 2.6 %; a busy job never resumes, so it pays none);
   and each busy neighbour takes a share `BUSY_PAIR_COST` (by the job's own kind) x its
   demand x the neighbour's off a job's speed: memory-bound jobs thrash each other's
   caches and bandwidth (they lose 10 %, compute-bound ones about 4 %).

Three constants come from four rows (S+S for the switch cost; C+C, M+M and C+M for
the busy-pair costs, the compute one the mean of C+C's and C+M's); the other three rows
(S+S+S+S, C+S, C+S+S+S) are predictions. `fit_errors()` gives every row's error; tests/
test_packing_model.py holds it within `FIT_BOUND`. Pure: no I/O, no randomness.

What it leaves out (docs/benchmarks.md): transfers over PCIe/NVLink, memory-bandwidth
interplay beyond these rows, MPS, how the switch cost grows past four processes, and
demands other than ~4 % and ~100 %, which the table does not cover (step 1 interpolates).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

FIT_BOUND = 0.03  # every row's per-job speed within this of the measured one


@dataclass(frozen=True)
class Load:
    """A job as the sharing model sees it."""

    demand: float  # share of a card's time it keeps busy alone, 0-1
    memory_bound: bool = False


# Fitted (see the module docstring). S+S: step 1 gives 0.999, measured 0.987.
SWITCH_COST = 0.0125
# After steps 1-2 a compute-bound job lost 3.7 % beside C and 1.5 % beside M; one constant
# for both keeps the cost a function of the job's own kind. M lost 9-10 % beside either.
BUSY_PAIR_COST = {False: 0.037, True: 0.100}
_ROUNDS = 50  # fixed-point iterations of step 1; it settles in under 20


def _share_while_active(others_active: Sequence[float]) -> float:
    """E[1 / (1 + N)], N the number of other jobs computing at a random instant."""
    counts = [1.0]  # counts[n]: probability that n others compute
    for p in others_active:
        nxt = [0.0] * (len(counts) + 1)
        for n, q in enumerate(counts):
            nxt[n] += q * (1.0 - p)
            nxt[n + 1] += q * p
        counts = nxt
    return sum(q / (1 + n) for n, q in enumerate(counts))


def speeds(jobs: Sequence[Load]) -> list[float]:
    """Each job's speed on a card shared by `jobs`, relative to the same job alone."""
    return list(_speeds(tuple(jobs)))


@functools.lru_cache(maxsize=65536)
def _speeds(jobs: tuple[Load, ...]) -> tuple[float, ...]:
    demands = [min(1.0, max(0.0, job.demand)) for job in jobs]
    active = list(demands)  # share of wall time each job has GPU work pending
    speed = [1.0] * len(jobs)
    for _ in range(_ROUNDS):
        for i, d in enumerate(demands):
            others = active[:i] + active[i + 1 :]
            stretch = 1.0 / _share_while_active(others)
            speed[i] = 1.0 / ((1.0 - d) + d * stretch)
        new_active = [min(1.0, d * stretch_of(s, d)) for d, s in zip(demands, speed, strict=True)]
        if max((abs(a - b) for a, b in zip(active, new_active, strict=True)), default=0.0) < 1e-9:
            break
        active = new_active
    # Step 2: the jobs together use the card exactly while any of them computes.
    busy = 1.0 - math.prod(1.0 - a for a in active)
    used = sum(d * s for d, s in zip(demands, speed, strict=True))
    if used > 0.0:
        speed = [min(1.0, s * busy / used) for s in speed]
    resumes = math.log2(len(jobs)) if jobs else 0.0
    result = []
    for i, (job, d, s) in enumerate(zip(jobs, demands, speed, strict=True)):
        switch = 1.0 - SWITCH_COST * resumes * (1.0 - d)
        pair = math.prod(
            1.0 - BUSY_PAIR_COST[job.memory_bound] * d * other
            for j, other in enumerate(demands)
            if j != i
        )
        result.append(s * switch * pair)
    return tuple(result)


def stretch_of(speed: float, demand: float) -> float:
    """A job's GPU work stretch k, given its speed: from speed = 1 / ((1 - d) + d k)."""
    if demand <= 0.0:
        return 1.0
    return (1.0 / speed - (1.0 - demand)) / demand


# What was measured: separate processes on one H200, each loop's steps per second
# relative to the same loop alone. C: bf16 matmuls back to back (~100 % busy); S: a ~4 ms
# burst, then 0.1 s waiting for data (~4 % busy); M: 1 GiB elementwise read-modify-write.
C = Load(1.0)
M = Load(1.0, memory_bound=True)
S = Load(0.04)
MEASURED: tuple[tuple[str, tuple[Load, ...], tuple[float, ...]], ...] = (
    ("C+C", (C, C), (0.475, 0.477)),
    ("M+M", (M, M), (0.450, 0.449)),
    ("C+M", (C, M), (0.487, 0.451)),
    ("S+S", (S, S), (0.987, 0.987)),
    ("S+S+S+S", (S, S, S, S), (0.974, 0.974, 0.974, 0.974)),
    ("C+S", (C, S), (0.961, 0.961)),
    ("C+S+S+S", (C, S, S, S), (0.886, 0.935, 0.948, 0.948)),
)


@dataclass(frozen=True)
class RowFit:
    row: str
    measured: tuple[float, ...]
    modelled: tuple[float, ...]

    @property
    def error(self) -> float:
        """The largest per-job error of the row (absolute, in speed)."""
        return max(abs(m - p) for m, p in zip(self.measured, self.modelled, strict=True))


def fit_errors() -> list[RowFit]:
    """The model against every measured row."""
    return [RowFit(name, measured, tuple(speeds(jobs))) for name, jobs, measured in MEASURED]
