"""Packing: what sharing cards gains and costs, with sharing priced as a real card prices it.

A discrete-event simulation replays a seeded lab trace (_packing_trace.py: 4 users,
Poisson arrivals, multi-GPU and whole-GPU jobs, jobs that use more than they declared;
mixes lab, all-busy, all-starved) on simulated 80 GB GPUs. At every event (a submit, a
job's end, a job allocating its memory) it asks gpusched's own `plan()` which waiting jobs
start where, as `Scheduler.tick()` does: GPUs as `GpuSlot` (free memory as the driver would
report it), running jobs as `RunningClaim` (their observed memory once allocated), the queue
as `WaitingJob`, each user's decayed memory-time as fair share (half-life 1 h, as by
default, when two or more users wait), headroom 512M.

Jobs sharing a card run at the speeds of the sharing model (_packing_model.py), fitted to
the table measured on an H200 (its per-row error is printed first); a job on several cards
runs at its slowest card's pace. A job allocates its real peak `ALLOC_LAG_S` after it
starts; if a card's real memory would then pass its total, that job is OOM-killed and
retried as gpusched's `--retry-oom` retries it: the retry keeps its first attempt's place
in the queue (`queue_order`) and asks 1.5x the memory (capped at a card less the
headroom); its work starts over.

Policies (_packing_policies.py): the default (`pack: contention`), `pack: memory`, best fit
(`placement: best-fit`) and one job per GPU, each gpusched's own `plan()` with that
option. A job's demand is known from its name's history (the median of the latest 5
demands measured for that name, as gpusched's history; before the trace, `--history`:
warm, each user's projects known but one new per kind, or cold, none: _packing_trace.py),
else its owner's latest 5 ended runs' when all were busy (the daemon's owner_prior_of),
or, running, once it has allocated; a job plan() held for a quieter card is timed from
the first plan that held it (`waited_s`, as the daemon's placer does).

Reported per mix and policy: makespan; slowdown (a job's last run time / its run time
alone; an OOM-retried job's lost attempt counts as wait, not slowdown) mean and 95th
percentile; mean wait (submit to end, less the last run: queueing and lost attempts); OOM
kills; makespan and slowdown against one job per GPU; and where the default's slowdown
comes from, by what each job's last run met on its cards (_packing_breakdown.py).

    python benchmarks/packing.py [--mix lab|all-busy|all-starved|all] [--seed N]
                                 [--history warm|cold] [--jobs N] [--gpus N] [--window-h H]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from _common import Figure, report
from _packing_breakdown import BUSY, Exposure
from _packing_model import FIT_BOUND, Load, speeds
from _packing_policies import (
    ONE_PER_GPU,
    POLICIES,
    Carry,
    Policy,
    Running,
    Waiting,
    place,
)
from _packing_report import SimResult, goals, print_fit, print_mix
from _packing_trace import (
    GPU_COUNT,
    GPU_MEM,
    HISTORIES,
    MIXES,
    GiB,
    TraceJob,
    describe,
    make_trace,
    prior_history,
    prior_owner_runs,
)

from gpusched.scheduling.policy import GpuSlot, RunningClaim, UsageSpan, WaitingJob, decayed_usage
from gpusched.usage.demand_history import owner_prior_of

HEADROOM = 512 * 2**20  # the default `headroom`
HALF_LIFE_S = 3600.0  # the default `fair_share_half_life`
ALLOC_LAG_S = 60.0  # a job allocates its memory this long after it starts
RETRY_GROWTH = 1.5  # gpusched's OOM retry asks this much more memory
DEFAULT_SEED = 20261121
DEFAULT_JOBS = 300
DEFAULT_WINDOW_H = 8.0
EPS = 1e-6
HISTORY_RUNS = 5  # usage/demand_history.py: the median of a name's latest 5 demands


@dataclass
class _Run:
    sim_id: int
    job: TraceJob
    mem: int | None
    cards: tuple[int, ...]
    start_s: float
    remaining_s: float  # work left, in seconds at solo speed
    exposure: Exposure  # what it met on its cards (the slowdown breakdown)
    allocated: bool = False


@dataclass
class _Queued:
    sim_id: int
    job: TraceJob
    mem: int | None
    submitted_s: float  # this attempt's: a retry is submitted when its first attempt dies


def retry_mem(mem: int, gpu_mem: int) -> int | None:
    """An OOM retry's --mem, as gpusched's retry_mem: 1.5x, capped; None: no larger."""
    grown = min(math.ceil(mem * RETRY_GROWTH / 2**20) * 2**20, gpu_mem - HEADROOM)
    return grown if grown > mem else None


def simulate(
    trace: Sequence[TraceJob],
    policy: Policy,
    gpus: int = GPU_COUNT,
    *,
    gpu_mem: int = GPU_MEM,
    prior: Mapping[str, float] | None = None,
    prior_owners: Mapping[str, Sequence[float]] | None = None,
) -> SimResult:
    """Replay `trace` under `policy`; `prior`: each name's demand measured before it;
    `prior_owners`: each user's latest ended runs' demands before it, oldest first."""
    uuids = [f"GPU-sim-{i}" for i in range(gpus)]
    arrivals = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
    next_arrival = 0
    queue: dict[int, _Queued] = {}
    running: dict[int, _Run] = {}
    first_id: dict[int, int] = {}  # sim id -> the job id of its first attempt
    # Job name -> the demands measured when its jobs ran; the policy is told the median of
    # the latest HISTORY_RUNS, as gpusched's demand history does.
    runs: dict[str, list[float]] = {name: [d] for name, d in (prior or {}).items()}

    # User -> the demands of their ended runs, oldest first (the owner prior, for a job
    # whose name has no history: `expected`).
    owner_ended: dict[str, list[float]] = {u: list(d) for u, d in (prior_owners or {}).items()}

    def history(name: str) -> float | None:
        seen = runs.get(name)
        return statistics.median(seen[-HISTORY_RUNS:]) if seen else None

    def expected(job: TraceJob) -> tuple[float | None, int]:
        """As the daemon's pass_rules.expected_demand: its name's history, else its owner's
        latest ended runs when all were busy (the daemon's own rule, `owner_prior_of`)."""
        own = history(job.name)
        if own is not None:
            return own, 0
        prior = owner_prior_of(owner_ended.get(job.user, [])[::-1])
        return (None, 0) if prior is None else (prior.demand, prior.runs)

    spans: list[UsageSpan] = []
    span_of: dict[int, int] = {}
    ended: dict[int, tuple[float, float]] = {}  # job id -> (end, last run time)
    last_exposure: dict[int, Exposure] = {}  # job id -> what its last run met
    next_sim_id = max(j.job_id for j in trace) + 1
    oom = plan_calls = most = 0
    plan_s = 0.0
    held: set[int] = set()
    held_since: dict[int, float] = {}  # sim id -> when plan() first held it for a quieter card
    carry = Carry()
    t = 0.0

    def loads(card: int) -> list[_Run]:
        return [r for r in running.values() if card in r.cards]

    def rates() -> dict[int, float]:
        rate: dict[int, float] = {}
        for card in range(gpus):
            on = loads(card)
            shares = speeds([Load(r.job.demand, r.job.memory_bound) for r in on])
            for r, s in zip(on, shares, strict=True):
                rate[r.sim_id] = min(rate.get(r.sim_id, 1.0), s)
        return rate

    def real_used(card: int) -> int:
        return sum(r.job.peak_bytes for r in loads(card) if r.allocated)

    while next_arrival < len(arrivals) or queue or running:
        if queue:
            slots = [GpuSlot(uuids[g], g, gpu_mem, gpu_mem - real_used(g)) for g in range(gpus)]
            claims = [
                Running(
                    RunningClaim(
                        r.sim_id,
                        tuple(uuids[g] for g in r.cards),
                        r.mem,
                        {uuids[g]: r.job.peak_bytes if r.allocated else 0 for g in r.cards},
                        user=r.job.user,
                    ),
                    r.job.demand if r.allocated else expected(r.job)[0],
                )
                for r in running.values()
            ]
            waiting = [
                Waiting(
                    WaitingJob(
                        q.sim_id,
                        q.mem,
                        gpu_count=min(q.job.gpus, gpus),
                        user=q.job.user,
                        queue_order=first_id.get(q.sim_id),
                    ),
                    *expected(q.job),
                    waited_s=t - held_since[q.sim_id] if q.sim_id in held_since else 0.0,
                )
                for q in queue.values()
            ]
            users_waiting = len({q.job.user for q in queue.values()})
            usage = decayed_usage(spans, t, HALF_LIFE_S) if users_waiting > 1 else {}
            begin = time.perf_counter()
            decision = place(
                policy, slots, claims, waiting, headroom=HEADROOM, user_usage=usage, carry=carry
            )
            plan_s += time.perf_counter() - begin
            plan_calls += 1
            for sim_id in decision.held_for_quiet:
                held.add(first_id.get(sim_id, sim_id))
                held_since.setdefault(sim_id, t)
            for placement in decision.placements:
                held_since.pop(placement.job_id, None)
                q = queue.pop(placement.job_id)
                cards = tuple(uuids.index(u) for u in placement.gpu_uuids)
                exposure = Exposure(q.job.demand >= BUSY, len(cards), q.sim_id in first_id)
                for other in {r.sim_id: r for g in cards for r in loads(g)}.values():
                    joined, from_owner = expected(q.job)
                    exposure.met(
                        other.exposure,
                        joined_unknown=joined is None,
                        there_unknown=not other.allocated and expected(other.job)[0] is None,
                        joined_by_owner=from_owner > 0,
                    )
                running[q.sim_id] = _Run(
                    q.sim_id, q.job, q.mem, cards, t, q.job.duration_s, exposure
                )
                held_bytes = len(cards) * (gpu_mem if q.mem is None else q.mem)
                span_of[q.sim_id] = len(spans)
                spans.append(UsageSpan(q.job.user, held_bytes, t, None))
            most = max([most, *(len(loads(g)) for g in range(gpus))])

        # -- the next event -------------------------------------------------------------------
        rate = rates()
        candidates = []
        if next_arrival < len(arrivals):
            candidates.append(arrivals[next_arrival].arrival_s)
        for r in running.values():
            candidates.append(t + r.remaining_s / rate[r.sim_id])
            if not r.allocated:
                candidates.append(r.start_s + ALLOC_LAG_S)
        if not candidates:
            raise RuntimeError(f"{policy.name}: {len(queue)} jobs can never start")
        t_next = max(t, min(candidates))
        for r in running.values():
            r.remaining_s -= (t_next - t) * rate[r.sim_id]
        t = t_next

        # -- what happens at t: ends first (they free memory), then allocations, then submits --
        for sim_id in [s for s, r in running.items() if r.remaining_s <= EPS * max(1.0, t)]:
            run = running.pop(sim_id)
            ended[run.job.job_id] = (t, t - run.start_s)
            owner_ended.setdefault(run.job.user, []).append(run.job.demand)
            last_exposure[run.job.job_id] = run.exposure
            spans[span_of[sim_id]] = replace(spans[span_of[sim_id]], end_s=t)
        for r in sorted(running.values(), key=lambda r: (r.start_s, r.sim_id)):
            if r.allocated or r.start_s + ALLOC_LAG_S > t + EPS:
                continue
            if any(real_used(g) + r.job.peak_bytes > gpu_mem for g in r.cards):
                oom += 1
                del running[r.sim_id]
                spans[span_of[r.sim_id]] = replace(spans[span_of[r.sim_id]], end_s=t)
                grown = retry_mem(r.mem, gpu_mem) if r.mem is not None else None
                if grown is None:
                    raise RuntimeError(f"job {r.job.job_id} can never fit: {r.job}")
                queue[next_sim_id] = _Queued(next_sim_id, r.job, grown, t)
                first_id[next_sim_id] = first_id.get(r.sim_id, r.sim_id)
                next_sim_id += 1
            else:
                r.allocated = True
                runs.setdefault(r.job.name, []).append(r.job.demand)
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrival_s <= t + EPS:
            job = arrivals[next_arrival]
            declared = None if policy.whole_gpu else job.declared_bytes
            queue[job.job_id] = _Queued(job.job_id, job, declared, t)
            next_arrival += 1

    by_kind: dict[str, list[float]] = {}
    for j in trace:
        by_kind.setdefault(j.kind, []).append(ended[j.job_id][1] / j.duration_s)
    return SimResult(
        policy=policy,
        makespan_s=max(end for end, _ in ended.values()),
        slowdowns=[ended[j.job_id][1] / j.duration_s for j in trace],
        waits_s=[ended[j.job_id][0] - j.arrival_s - ended[j.job_id][1] for j in trace],
        oom_kills=oom,
        plan_calls=plan_calls,
        plan_s=plan_s,
        most_on_a_card=most,
        held_for_quiet=len(held),
        by_kind=by_kind,
        exposures=[last_exposure[j.job_id] for j in trace],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Prints the sharing model's fit, then per mix a table of the four policies,"
        " then the goals with PASS/MISS and a RESULT"
        " line (for run_all.py). About a minute for all three mixes on 2 cores.",
    )
    parser.add_argument(
        "--mix",
        choices=[*MIXES, "all"],
        default="all",
        help="lab: 40%% data-starved (demand 5-30%%), 40%% busy (80-100%%), 20%% memory-bound;"
        " all-busy; all-starved; all: the three (default)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the trace's seed")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="jobs in the trace")
    parser.add_argument(
        "--gpus", type=int, default=GPU_COUNT, help=f"simulated 80 GB GPUs (default {GPU_COUNT})"
    )
    parser.add_argument(
        "--window-h",
        type=float,
        default=DEFAULT_WINDOW_H,
        help="hours over which the jobs arrive (default 8)",
    )
    parser.add_argument(
        "--history",
        choices=HISTORIES,
        default="warm",
        help="what gpusched measured before the trace: warm (default), each user's"
        " projects known but one new per kind; cold, nothing (gpusched's first day)",
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.gpus < 1 or args.window_h <= 0:
        parser.error("--jobs and --gpus must be at least 1, --window-h above 0")
    began = time.perf_counter()
    worst = print_fit()
    print(
        f"\n{args.gpus} simulated GPUs x {GPU_MEM / GiB:.0f} GB, headroom 512M, allocation lag"
        f" {ALLOC_LAG_S:.0f} s, seed {args.seed}, {args.history} history;"
        " slowdown: last run time / run time alone"
    )
    mixes = list(MIXES) if args.mix == "all" else [args.mix]
    by_mix: dict[str, list[SimResult]] = {}
    calls = 0
    plan_s = 0.0
    for mix in mixes:
        trace = make_trace(args.seed, args.jobs, args.window_h * 3600, mix, args.gpus)
        print(f"\n-- mix {mix}: {describe(trace)}")
        prior = prior_history(args.seed, args.history)
        owners = prior_owner_runs(args.seed, args.history, mix)
        by_mix[mix] = [
            simulate(trace, policy, args.gpus, prior=prior, prior_owners=owners)
            for policy in POLICIES
        ]
        print_mix(mix, by_mix[mix])
        calls += sum(r.plan_calls for r in by_mix[mix])
        plan_s += sum(r.plan_s for r in by_mix[mix])
    print(
        "\n  held: jobs plan() held for a quieter card at least once;"
        " most/card: most jobs seen on one card"
    )
    print(
        f"plan() called {calls} times, {plan_s:.1f} s; whole run"
        f" {time.perf_counter() - began:.1f} s"
    )
    figures = [
        Figure(
            "sharing model: largest per-job error", worst, "", f"<= {FIT_BOUND}", worst <= FIT_BOUND
        )
    ]
    for mix, results in by_mix.items():
        whole = next(r for r in results if r.policy == ONE_PER_GPU)
        for r in results:
            figures.append(Figure(f"{mix}, {r.policy.name}: makespan", r.makespan_s / 3600, "h"))
            figures.append(
                Figure(
                    f"{mix}, {r.policy.name}: one-per-GPU / it",
                    whole.makespan_s / r.makespan_s,
                    "x",
                )
            )
            figures.append(Figure(f"{mix}, {r.policy.name}: mean slowdown", r.mean_slowdown, "x"))
    figures += goals(by_mix)
    report("packing", figures)


if __name__ == "__main__":
    main()
