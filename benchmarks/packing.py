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
option. A job's demand is known from its name's history (an earlier job of that name has
allocated) or, running, once it has allocated; a job plan() held for a quieter card is
timed from the first plan that held it (`waited_s`, as the daemon's placer does).

Reported per mix and policy: makespan; slowdown (a job's last run time / its run time
alone) mean and 95th percentile; mean wait (submit to end, less the last run: queueing and
lost attempts); OOM kills; makespan and slowdown against one job per GPU.

    python benchmarks/packing.py [--mix lab|all-busy|all-starved|all] [--seed N]
                                 [--jobs N] [--gpus N] [--window-h H]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from _common import Figure, report
from _packing_breakdown import BUSY, Exposure, lines
from _packing_model import FIT_BOUND, Load, fit_errors, speeds
from _packing_policies import (
    DEFAULT,
    ONE_PER_GPU,
    POLICIES,
    Carry,
    Policy,
    Running,
    Waiting,
    place,
)
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
)

from gpusched.scheduling.gpu_budget import GpuSlot, RunningClaim
from gpusched.scheduling.policy import UsageSpan, WaitingJob, decayed_usage

HEADROOM = 512 * 2**20  # the default `headroom`
HALF_LIFE_S = 3600.0  # the default `fair_share_half_life`
ALLOC_LAG_S = 60.0  # a job allocates its memory this long after it starts
RETRY_GROWTH = 1.5  # gpusched's OOM retry asks this much more memory
DEFAULT_SEED = 20261121
DEFAULT_JOBS = 300
DEFAULT_WINDOW_H = 8.0
EPS = 1e-6
HISTORY_RUNS = 5  # usage/demand_history.py: the median of a name's latest 5 demands
# The goals for the default policy.
LAB_MAKESPAN_GAIN = 1.3  # one-per-GPU makespan / the default's, at least
LAB_MEAN_SLOWDOWN = 1.1  # at most


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


@dataclass
class SimResult:
    policy: Policy
    makespan_s: float
    slowdowns: list[float]
    waits_s: list[float]
    oom_kills: int
    plan_calls: int
    plan_s: float
    most_on_a_card: int
    held_for_quiet: int = 0  # jobs the contention rule kept off busy cards at least once
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # slowdowns per kind
    exposures: list[Exposure] = field(default_factory=list)  # per trace job, its last run

    @property
    def mean_slowdown(self) -> float:
        return statistics.fmean(self.slowdowns)

    @property
    def p95_slowdown(self) -> float:
        ordered = sorted(self.slowdowns)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(self.waits_s)


def retry_mem(mem: int, gpu_mem: int) -> int | None:
    """An OOM retry's --mem, as gpusched's retry_mem: 1.5x, capped; None: no larger."""
    grown = min(math.ceil(mem * RETRY_GROWTH / 2**20) * 2**20, gpu_mem - HEADROOM)
    return grown if grown > mem else None


def simulate(
    trace: Sequence[TraceJob],
    policy: Policy,
    gpus: int = GPU_COUNT,
    gpu_mem: int = GPU_MEM,
    prior: Mapping[str, float] | None = None,
) -> SimResult:
    """Replay `trace` under `policy`; `prior`: each name's demand measured before it."""
    uuids = [f"GPU-sim-{i}" for i in range(gpus)]
    arrivals = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
    next_arrival = 0
    queue: dict[int, _Queued] = {}
    running: dict[int, _Run] = {}
    first_id: dict[int, int] = {}  # sim id -> the job id of its first attempt
    # Job name -> the demands measured when its jobs ran; the policy is told the median of
    # the latest HISTORY_RUNS, as gpusched's demand history does.
    runs: dict[str, list[float]] = {name: [d] for name, d in (prior or {}).items()}

    def history(name: str) -> float | None:
        seen = runs.get(name)
        return statistics.median(seen[-HISTORY_RUNS:]) if seen else None

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
                    r.job.demand if r.allocated else history(r.job.name),
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
                    history(q.job.name),
                    t - held_since[q.sim_id] if q.sim_id in held_since else 0.0,
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
                    exposure.met(
                        other.exposure,
                        joined_unknown=history(q.job.name) is None,
                        there_unknown=not other.allocated and history(other.job.name) is None,
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


# -- reporting ----------------------------------------------------------------------------------


def print_fit() -> float:
    """The sharing model against the measured table; returns the largest error."""
    print("sharing model vs the H200 table (each job's speed vs alone):")
    worst = 0.0
    for row in fit_errors():
        measured = ", ".join(f"{x:.3f}" for x in row.measured)
        modelled = ", ".join(f"{x:.3f}" for x in row.modelled)
        print(f"  {row.row:<8} measured {measured:<30} model {modelled:<30} error {row.error:.4f}")
        worst = max(worst, row.error)
    verdict = "PASS" if worst <= FIT_BOUND else "MISS"
    print(f"  largest error {worst:.4f} (bound {FIT_BOUND}) {verdict}")
    return worst


def print_mix(mix: str, results: list[SimResult]) -> None:
    whole = next(r for r in results if r.policy == ONE_PER_GPU)
    print(
        f"  {'policy':<22}{'makespan h':>11}{'one-per-GPU/it':>15}{'slowdown mean':>14}"
        f"{'p95':>7}{'vs one-per-GPU':>15}{'mean wait h':>12}{'OOM':>5}{'most/card':>10}"
        f"{'held':>6}"
    )
    for r in results:
        print(
            f"  {r.policy.name:<22}{r.makespan_s / 3600:>11.2f}"
            f"{whole.makespan_s / r.makespan_s:>15.3f}{r.mean_slowdown:>14.3f}"
            f"{r.p95_slowdown:>7.3f}{r.mean_slowdown / whole.mean_slowdown:>15.3f}"
            f"{r.mean_wait_s / 3600:>12.2f}{r.oom_kills:>5}{r.most_on_a_card:>10}"
            f"{r.held_for_quiet:>6}"
        )
    default = next(r for r in results if r.policy == DEFAULT)
    kinds = "  ".join(
        f"{kind} {statistics.fmean(values):.3f}" for kind, values in sorted(default.by_kind.items())
    )
    print(f"  default's mean slowdown by kind: {kinds}")
    print("  default's slowdown by what each job's last run met on its cards:")
    for line in lines(zip(default.exposures, default.slowdowns, strict=True)):
        print(line)


def goals(by_mix: dict[str, list[SimResult]]) -> list[Figure]:
    """The issue's goals for the default policy, where their mix was run."""
    figures = []
    if "lab" in by_mix:
        whole = next(r for r in by_mix["lab"] if r.policy == ONE_PER_GPU)
        default = next(r for r in by_mix["lab"] if r.policy == DEFAULT)
        gain = whole.makespan_s / default.makespan_s
        figures.append(
            Figure(
                "lab, default: one-per-GPU makespan / its",
                gain,
                "x",
                f">= {LAB_MAKESPAN_GAIN}",
                gain >= LAB_MAKESPAN_GAIN,
            )
        )
        slow = default.mean_slowdown
        figures.append(
            Figure(
                "lab, default: mean slowdown",
                slow,
                "x",
                f"<= {LAB_MEAN_SLOWDOWN}",
                slow <= LAB_MEAN_SLOWDOWN,
            )
        )
    if "all-busy" in by_mix:
        whole = next(r for r in by_mix["all-busy"] if r.policy == ONE_PER_GPU)
        default = next(r for r in by_mix["all-busy"] if r.policy == DEFAULT)
        ratio = default.mean_slowdown / whole.mean_slowdown
        figures.append(
            Figure(
                "all-busy, default: mean slowdown / one-per-GPU's",
                ratio,
                "x",
                "<= 1.0",
                ratio <= 1.0 + 1e-9,
            )
        )
    return figures


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
        by_mix[mix] = [simulate(trace, policy, args.gpus, prior=prior) for policy in POLICIES]
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
