"""`--time` kept under packing: gpusched does not slow a job past its limit by sharing.

A user's `--time` is a promise about the job alone; gpusched's own choice to pack it
beside others must not break it, and the limit itself never stretches (time backfill,
module head_claim, relies on it). The contention model (module contention, FIELD.md's
table): on a card whose jobs' demands (budget's `job_demand`: unknown counts as busy,
`--share` and interactive as light) add up to at most one card's busy time, each runs at
about its speed alone; past that, time-slicing gives each about 1/total of it, less
SHARED_LOSS (`speed`: two busy jobs each at 0.475x). So, under `pack: contention`:

- a waiting job with `--time` is taken to need all of it alone (gpusched cannot know
  that it ends sooner): it starts only where its cards, with it, stay within one card's
  busy time;
- a job with a `--time` already on the card (running, or placed by this plan) is taken
  to need all that is left of it at the speed it runs now (what it has done so far is
  not known: the conservative reading): no job starts beside it that would slow it.

A job that fits by memory only where one of these would break is held for a quieter
card (module quieter keeps the bound, the reason says whose `--time`). Jobs without a
`--time`, beside none, and jobs that keep every card within its busy time are not
affected: the default rule places them. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.core.units import format_duration
from gpusched.scheduling.policy.budget import PlanGpu, job_demand
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.words import job_list

# What time-slicing loses once a card's demands add past its busy time (FIELD.md: 5 %,
# 10 % for memory-bound jobs; the H200's C+C pair ran at 0.475x each).
SHARED_LOSS = 0.05
_EPS = 1e-9


def speed(total_demand: float) -> float:
    """A job's speed against alone on a card whose jobs' demands add up to `total_demand`."""
    if total_demand <= 1.0 + _EPS:
        return 1.0
    return (1.0 - SHARED_LOSS) / total_demand


def timed_jobs(gpu: PlanGpu) -> list[int]:
    """The jobs on the card with a `--time` (running, or placed by this plan)."""
    return [job_id for job_id, _, ends in gpu.holds if ends is not None]


def keeps_time(job: WaitingJob, gpu: PlanGpu) -> bool:
    """Whether `job` on this card keeps its own `--time` and every `--time` there."""
    added = job_demand(job.demand, job.share)
    after = gpu.demand + added
    if after <= 1.0 + _EPS:
        return True
    if job.time_limit_s is not None:
        return False
    # Past the card's busy time: every job there slows, unless this one adds nothing.
    return added <= _EPS or not timed_jobs(gpu)


def within_time(job: WaitingJob, cards: Sequence[PlanGpu]) -> list[PlanGpu]:
    """The cards of `cards` where `job` keeps every `--time` (module docstring)."""
    return [g for g in cards if keeps_time(job, g)]


def broken_time(job: WaitingJob, cards: Sequence[PlanGpu]) -> str:
    """What a held job's reason says of the `--time` sharing `cards` would break: its own
    (with the speed it would have on the quietest), else the running jobs'."""
    if job.time_limit_s is not None:
        added = job_demand(job.demand, job.share)
        best = min(cards, key=lambda g: g.demand)
        return (
            f"sharing would slow it to about {speed(best.demand + added):.0%} of its speed"
            f" alone, past its --time of {format_duration(job.time_limit_s)}"
        )
    timed = sorted({j for g in cards for j in timed_jobs(g)})
    return f"sharing would slow {job_list(timed)} past {_their(timed)} --time"


def _their(ids: Sequence[int]) -> str:
    return "its" if len(ids) == 1 else "their"
