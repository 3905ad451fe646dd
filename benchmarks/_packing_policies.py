"""The packing benchmark's policies, each a way of calling gpusched's own `plan()`.

  default            `pack: contention` (issue 25: busy jobs apart), `placement: most-free`
  pack: memory       memory alone decides, as gpusched did before issue 25
  best fit           `placement: best-fit` (the tightest card that fits), pack as by default
  one job per GPU    every job a whole-GPU job (no --mem): task-spooler -G, gflow's default

Each is plan() itself, called as the scheduler's pass calls it (pass_rules.decide): the
waiting jobs' and running jobs' `demand` (0-1, None: no history; a job whose name has
none takes its owner's latest ended runs' when all were busy, as the daemon does), each
waiting job's `waited_s` since plan() first held it for a quieter card (the simulation
keeps that time as the placer's QuieterWaits does), and the head's claim handed back from
plan to plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusched.scheduling.policy import GpuSlot, HeadClaim, Placement, RunningClaim, WaitingJob, plan


@dataclass(frozen=True)
class Policy:
    name: str
    pack: str  # "contention" or "memory"
    placement: str = "most-free"  # or "best-fit"
    whole_gpu: bool = False  # every job without --mem


DEFAULT = Policy("default (contention)", "contention")
MEMORY = Policy("pack: memory", "memory")
BEST_FIT = Policy("best fit", "contention", "best-fit")
ONE_PER_GPU = Policy("one job per GPU", "memory", whole_gpu=True)
POLICIES = (DEFAULT, MEMORY, BEST_FIT, ONE_PER_GPU)


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the simulation hands it over: what plan() needs and what the
    policy knows of its demand (None: no history)."""

    job: WaitingJob
    demand: float | None
    owner_runs: int = 0  # >0: `demand` is its owner's latest runs' (no history of its own)
    waited_s: float = 0.0  # since plan() first held it for a quieter card


@dataclass(frozen=True)
class Running:
    claim: RunningClaim
    demand: float | None  # measured once it runs, else its history, else None


@dataclass
class Decision:
    placements: list[Placement]
    held_for_quiet: frozenset[int]  # waiting jobs plan() held for a quieter card


@dataclass
class Carry:
    """What a scheduler keeps from one plan() to the next: the head's stored claim."""

    head_claim: HeadClaim | None = None


def place(
    policy: Policy,
    slots: list[GpuSlot],
    running: list[Running],
    waiting: list[Waiting],
    *,
    headroom: int,
    user_usage: dict[str, float],
    carry: Carry,
) -> Decision:
    """Which waiting jobs start where under `policy`: one plan(), as one pass makes it."""
    claims = [replace(r.claim, demand=r.demand) for r in running]
    jobs = [
        replace(w.job, demand=w.demand, owner_runs=w.owner_runs, waited_s=w.waited_s)
        for w in waiting
    ]
    result = plan(
        slots,
        claims,
        jobs,
        headroom,
        user_usage=user_usage,
        head_claim=carry.head_claim,
        pack="memory" if policy.whole_gpu else policy.pack,
        placement=policy.placement,
    )
    carry.head_claim = result.head_claim
    return Decision(result.placements, result.quieter)
