"""The packing benchmark's traces: seeded, lab-like queues of jobs in three named mixes.

Sizes as the first packing benchmark's trace: declared memory log-normal (median 8 GB,
2-40 GB, whole GB), solo durations log-normal (median 40 min, 3 min-12 h). Added here:
4 users of unequal weight (40/30/20/10 %), Poisson arrivals (exponential gaps) over a
working day, multi-GPU jobs (10 % on 2 cards, 2 % on all 4), whole-GPU jobs (10 %: no
--mem), and jobs whose real peak exceeds their declaration (15 %: 1.05-1.6x, which OOM
when the card cannot hold it). The others peak at 50-100 % of their declaration.

A job's kind decides its compute demand (the share of a card it keeps busy alone) and
whether it is memory-bound, both inputs of the sharing model (_packing_model.py):
  data-starved   demand 5-30 %   (a burst, then waiting for the next batch)
  busy           demand 80-100 %
  memory-bound   demand 80-100 %, memory-bound
A mix is the share of each kind: lab 40/40/20, all-busy 0/67/33 (the lab's busy kinds in
the lab's proportion), all-starved 100/0/0. Sizes and arrivals come from one random
stream and kinds from another, so the three mixes of one seed are the same jobs, the
same sizes at the same times, differing only in kind.

What the policy knows of a job's demand: its history, i.e. the measured demand of an
earlier job of the same name (people rerun their scripts). Each user runs 3 names
(projects) per kind. Two models of what was measured before the trace begins
(`prior_history`):
  warm (the default)  the lab has used gpusched before: of each user's 3 projects per
                      kind, 2 ran on earlier days (their history is a demand drawn from
                      the kind's range) and 1 is new today (`NEW_PROJECT`): its first job
                      has no history until it has allocated
  cold                gpusched's first day: no name has history, so the first job of
                      each of the 36 names (4 users x 3 kinds x 3) is unknown
Either way a job's own demand is drawn per job within its kind's range, so a name's
history is close to, not equal to, the next job's demand.

A job whose name has no history takes its owner's latest OWNER_RUNS ended runs' demand
when they were all busy, as the daemon does (gpusched.usage.demand_history's
owner_prior_of; the simulation keeps each user's ended runs in the order they end).
Before the trace (`prior_owner_runs`): warm, each user's latest OWNER_RUNS runs of earlier
days, their kinds drawn by today's mix (the lab ran the same work then; in every mix a
job's kind is drawn apart from its user, so in lab a user's runs are mixed); cold, none.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpusched.usage.demand_history import OWNER_RUNS

GiB = 2**30
GPU_COUNT = 4
GPU_MEM = 80 * GiB
MAX_PEAK = 76 * GiB  # a job's real peak never passes what a card could give it alone

USERS = (("alice", 0.4), ("bob", 0.3), ("carol", 0.2), ("dan", 0.1))
KINDS = ("starved", "busy", "memory")
MIXES: dict[str, tuple[float, float, float]] = {  # share of each of KINDS
    "lab": (0.4, 0.4, 0.2),
    "all-busy": (0.0, 2 / 3, 1 / 3),
    "all-starved": (1.0, 0.0, 0.0),
}
NAMES_PER_KIND = 3  # projects per user and kind: a name's first job has no history
NEW_PROJECT = 0  # the project of each user and kind that is new today (warm history)
HISTORIES = ("warm", "cold")
DEMAND_RANGE = {"starved": (0.05, 0.30), "busy": (0.80, 1.00), "memory": (0.80, 1.00)}


@dataclass(frozen=True)
class TraceJob:
    job_id: int
    user: str
    name: str  # what history is kept by: the same name, the same kind of job
    arrival_s: float
    gpus: int
    declared_bytes: int | None  # --mem per GPU; None: a whole GPU
    peak_bytes: int  # what it really allocates on each of its GPUs
    duration_s: float  # alone on its GPUs
    kind: str  # one of KINDS
    demand: float  # share of a card it keeps busy alone, 0-1
    memory_bound: bool

    @property
    def under_declared(self) -> bool:
        return self.declared_bytes is not None and self.peak_bytes > self.declared_bytes


def _kind(rng: random.Random, mix: tuple[float, float, float]) -> tuple[str, float, bool]:
    pick = rng.random()
    starved, busy, _ = mix
    if pick < starved:
        return "starved", rng.uniform(*DEMAND_RANGE["starved"]), False
    if pick < starved + busy:
        return "busy", rng.uniform(*DEMAND_RANGE["busy"]), False
    return "memory", rng.uniform(*DEMAND_RANGE["memory"]), True


def name_of(user: str, kind: str, project: int) -> str:
    return f"{user}/{kind}-{project}"


def prior_history(seed: int, history: str) -> dict[str, float]:
    """The demand measured for each name before the trace begins (see the docstring):
    warm, every project but `NEW_PROJECT` of each user and kind; cold, none. Drawn from a
    stream of its own, so the trace's jobs are the same under either model."""
    if history == "cold":
        return {}
    rng = random.Random(f"{seed}-history")
    return {
        name_of(user, kind, project): rng.uniform(*DEMAND_RANGE[kind])
        for user, _ in USERS
        for kind in KINDS
        for project in range(NAMES_PER_KIND)
        if project != NEW_PROJECT
    }


def prior_owner_runs(seed: int, history: str, mix: str) -> dict[str, list[float]]:
    """Each user's latest OWNER_RUNS ended runs' demands before the trace, oldest first
    (see the docstring): warm, kinds drawn by `mix`; cold, none. A stream of its own."""
    if history == "cold":
        return {}
    rng = random.Random(f"{seed}-{mix}-owners")
    return {user: [_kind(rng, MIXES[mix])[1] for _ in range(OWNER_RUNS)] for user, _ in USERS}


def make_trace(
    seed: int, n_jobs: int, window_s: float, mix: str, gpu_count: int = GPU_COUNT
) -> list[TraceJob]:
    """`n_jobs` jobs arriving as a Poisson process at `n_jobs / window_s` per second
    (jobs on more cards than `gpu_count` take all of them)."""
    sizes = random.Random(seed)
    kinds = random.Random(f"{seed}-{mix}")
    users = [name for name, _ in USERS]
    weights = [weight for _, weight in USERS]
    trace = []
    t = 0.0
    for job_id in range(1, n_jobs + 1):
        t += sizes.expovariate(n_jobs / window_s)
        user = sizes.choices(users, weights)[0]
        # Long-tailed declarations: median 8 GB, a few near 40 GB; people round to whole GB.
        declared = min(40, max(2, round(sizes.lognormvariate(math.log(8), 0.75)))) * GiB
        shape = sizes.random()
        if shape < 0.10:  # a whole-GPU job: its peak is what it uses, alone on the card
            mem, peak = None, int(declared * sizes.uniform(0.5, 1.0))
        elif shape < 0.25:  # under-declared: it needs more than it asked for
            mem, peak = declared, int(declared * sizes.uniform(1.05, 1.6))
        else:
            mem, peak = declared, int(declared * sizes.uniform(0.5, 1.0))
        width = sizes.random()
        gpus = 4 if width < 0.02 else 2 if width < 0.12 else 1
        # Minutes to hours: median 40 min, mean about 65 min, a few of 6-12 h.
        duration = min(12 * 3600.0, max(180.0, sizes.lognormvariate(math.log(40 * 60), 1.0)))
        project = sizes.randrange(NAMES_PER_KIND)
        kind, demand, memory_bound = _kind(kinds, MIXES[mix])
        trace.append(
            TraceJob(
                job_id,
                user,
                name_of(user, kind, project),
                t,
                min(gpus, gpu_count),
                mem,
                min(peak, MAX_PEAK),
                duration,
                kind,
                demand,
                memory_bound,
            )
        )
    return trace


def describe(trace: list[TraceJob]) -> str:
    """A few lines on what the trace holds."""
    n = len(trace)
    per_user = ", ".join(f"{u} {sum(j.user == u for j in trace)}" for u, _ in USERS)
    per_kind = ", ".join(f"{k} {sum(j.kind == k for j in trace)}" for k in KINDS)
    gpu_h = sum(j.duration_s * j.gpus for j in trace) / 3600
    compute_h = sum(j.duration_s * j.gpus * j.demand for j in trace) / 3600
    return (
        f"{n} jobs over {trace[-1].arrival_s / 3600:.2f} h; users: {per_user}; kinds: {per_kind}\n"
        f"  on 2 GPUs {sum(j.gpus == 2 for j in trace)}, on 4 GPUs"
        f" {sum(j.gpus == 4 for j in trace)}, whole-GPU (no --mem)"
        f" {sum(j.declared_bytes is None for j in trace)}, peak over the declaration"
        f" {sum(j.under_declared for j in trace)}\n"
        f"  solo GPU-hours {gpu_h:.1f}; compute work (demand x duration x GPUs) {compute_h:.1f}"
    )
