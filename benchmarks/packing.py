"""Packing: how much sooner a lab's queue drains when gpusched packs jobs by memory.

A seeded generator makes a lab-like trace (declared memory 2-40 GB, long-tailed; real
peak 50-100 % of the declaration; durations of minutes to hours; compute demand 20-100 %
of a GPU). A discrete-event simulation replays it on 4 simulated 80 GB GPUs and, at
every event (a submit, a job's end, a job allocating its memory), asks gpusched's own
`gpusched.scheduling.policy.plan()` which waiting jobs start where, exactly as `Scheduler.tick()`
does: GPUs as `GpuSlot` (free memory as the driver would report it), running jobs as
`RunningClaim` (with their observed usage), the queue as `WaitingJob`.

Sharing a GPU is not free: jobs on one GPU progress at min(1, 100 / sum of their compute
demands) of their solo speed. A job allocates its real peak ALLOC_LAG_S after it starts
(the allocation lag the reservations exist for); if the GPU's real memory would then
exceed its total, the job is OOM-killed, and its owner resubmits it (back of the queue).

Policies compared, all through the same `plan()`:
  gpusched            jobs declare --mem; free memory and per-job usage measured
  one job per GPU     every job a whole-GPU job (mem=None): task-spooler -G,
                      simple_gpu_scheduler, gflow's default
  declared only       gflow --shared style: only declarations count, nothing measured
                      (free = total, observed usage = 0)
  gpusched, usage     gpusched where NVML cannot attribute memory to a job's processes
    unattributed      (e.g. in a container): free measured, observed usage 0
  gpusched, max_jobs_per_gpu: 4   gpusched with that config key set
  gpusched, busy_util: 100%       gpusched with compute-aware admission (policy rule 6):
                      a GPU whose measured utilization is saturated takes no new job
Lower bound: no schedule beats max(longest job after its arrival, compute work or
memory-time arriving after t spread over every GPU, for every t).

    python benchmarks/packing.py [--seed N] [--jobs N] [--window-h H] [--seeds K]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from _common import Figure, GiB, report

from gpusched.core.config import Config
from gpusched.scheduling.gpu_budget import GpuSlot, RunningClaim
from gpusched.scheduling.policy import WaitingJob, plan

GPU_COUNT = 4
GPU_MEM = 80 * GiB
_DEFAULT_HEADROOM = next(f.default for f in fields(Config) if f.name == "headroom_bytes")
assert isinstance(_DEFAULT_HEADROOM, int)
HEADROOM = _DEFAULT_HEADROOM  # 512M
ALLOC_LAG_S = 60.0  # a job allocates its memory this long after it starts
DEFAULT_SEED = 20261121
DEFAULT_JOBS = 300
DEFAULT_WINDOW_H = 8.0  # jobs are submitted during one working day
EPS = 1e-6


# -- the trace ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceJob:
    job_id: int
    arrival_s: float
    declared_bytes: int  # what the user passes as --mem
    peak_bytes: int  # what the job really allocates
    duration_s: float  # alone on a GPU
    demand: float  # share of a GPU's compute it uses alone, 0.2-1.0


@dataclass(frozen=True)
class Foreign:
    """Memory held by a process gpusched did not start (someone's notebook)."""

    start_s: float
    end_s: float
    gpu: int
    bytes: int


def make_trace(seed: int, n_jobs: int, window_s: float) -> list[TraceJob]:
    """Lab-like jobs, submitted as a Poisson process over `window_s` (uniform order stats)."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, window_s) for _ in range(n_jobs))
    trace = []
    for job_id, arrival in enumerate(arrivals, start=1):
        # Long-tailed declarations: median 8 GB, a few near 40 GB; people round to whole GB.
        declared_gb = min(40, max(2, round(rng.lognormvariate(math.log(8), 0.75))))
        declared = declared_gb * GiB
        peak = int(declared * rng.uniform(0.5, 1.0))
        # Minutes to hours: median 40 min, mean about 65 min, a few of 6-12 h.
        duration = min(12 * 3600.0, max(180.0, rng.lognormvariate(math.log(40 * 60), 1.0)))
        demand = rng.uniform(0.2, 1.0)
        trace.append(TraceJob(job_id, arrival, declared, peak, duration, demand))
    return trace


def make_interference(seed: int, horizon_s: float, mean_gap_s: float) -> list[Foreign]:
    """Processes outside gpusched: 8-24 GB for 10 min-6 h, about one every `mean_gap_s`."""
    rng = random.Random(seed + 1)
    result: list[Foreign] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / mean_gap_s)
        if t >= horizon_s:
            return result
        duration = min(6 * 3600.0, max(600.0, rng.lognormvariate(math.log(3600), 0.8)))
        size = rng.randint(8, 24) * GiB
        result.append(Foreign(t, t + duration, rng.randrange(GPU_COUNT), size))


def _dist(values: Sequence[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"min {ordered[0]:.3g}  median {statistics.median(ordered):.3g}"
        f"  mean {statistics.fmean(ordered):.3g}  p95 {p95:.3g}  max {ordered[-1]:.3g}"
    )


def describe_trace(trace: Sequence[TraceJob]) -> dict[str, float]:
    work_h = sum(j.duration_s for j in trace) / 3600
    compute_h = sum(j.demand * j.duration_s for j in trace) / 3600
    print(f"trace: {len(trace)} jobs submitted over {trace[-1].arrival_s / 3600:.2f} h")
    print(f"  declared GB      {_dist([j.declared_bytes / GiB for j in trace])}")
    print(f"  peak/declared    {_dist([j.peak_bytes / j.declared_bytes for j in trace])}")
    print(f"  duration min     {_dist([j.duration_s / 60 for j in trace])}")
    print(f"  compute demand   {_dist([j.demand for j in trace])}")
    print(f"  solo GPU-hours {work_h:.1f}; compute work (demand x duration) {compute_h:.1f} GPU-h")
    return {"jobs": len(trace), "gpu_hours": work_h, "compute_gpu_hours": compute_h}


def lower_bound_s(trace: Sequence[TraceJob], gpus: int = GPU_COUNT, mem: int = GPU_MEM) -> float:
    """No schedule of this trace on these GPUs ends sooner (not even an oracle's).

    Compute work of a job = demand x solo duration (a GPU does at most 1 unit per second,
    however its jobs share it); memory-time = real peak x (duration - allocation lag).
    Work submitted at or after t cannot start before t, so for every submit time t the
    makespan is at least t + (work submitted from t on) / (capacity of every GPU).
    """
    bound = max(j.arrival_s + j.duration_s for j in trace)
    compute = memory = 0.0
    for job in sorted(trace, key=lambda j: j.arrival_s, reverse=True):
        compute += job.demand * job.duration_s
        memory += job.peak_bytes * max(0.0, job.duration_s - ALLOC_LAG_S)
        bound = max(bound, job.arrival_s + compute / gpus, job.arrival_s + memory / (gpus * mem))
    return bound


# -- the simulation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    name: str
    whole_gpu: bool  # jobs submitted without --mem: one job per GPU
    measure_free: bool  # GpuSlot.free_bytes from the driver (False: always the total)
    observe_usage: bool  # RunningClaim.used_bytes from the driver's per-process memory
    max_jobs_per_gpu: int | None = None  # the config key of that name
    busy_util: float | None = None  # the config key of that name (rule 6, compute)


GPUSCHED = Policy("gpusched", whole_gpu=False, measure_free=True, observe_usage=True)
CAPPED = Policy("gpusched, max_jobs_per_gpu: 4", False, True, True, max_jobs_per_gpu=4)
ONE_PER_GPU = Policy("one job per GPU", whole_gpu=True, measure_free=True, observe_usage=True)
DECLARED = Policy("declared only (gflow --shared)", False, measure_free=False, observe_usage=False)
UNATTRIBUTED = Policy("gpusched, usage unattributed", False, measure_free=True, observe_usage=False)
BUSY = Policy("gpusched, busy_util: 100%", False, True, True, busy_util=100.0)
POLICIES = (GPUSCHED, ONE_PER_GPU, DECLARED, UNATTRIBUTED, CAPPED, BUSY)
BUSY_GRID = (80.0, 90.0, 95.0, 100.0)  # busy_util values tried on the default trace


@dataclass
class _Run:
    job: TraceJob
    sim_id: int
    gpu: int
    start_s: float
    remaining_s: float  # work left, in seconds of solo speed
    allocated: bool = False


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    waits_s: list[float]
    turnarounds_s: list[float]  # submit to end of each job: what its owner waits for
    mem_used_s: float  # byte-seconds of real job memory
    mem_reserved_s: float  # byte-seconds held for gpusched jobs (declared, or whole GPUs)
    compute_used_s: float  # GPU-seconds of compute actually delivered
    oom_kills: int
    oom_after_foreign: int  # of which: a foreign process took the memory after placement
    foreign_refused: int  # foreign processes that found no room
    plan_calls: int
    plan_s: float
    starts: int
    by_gpu_jobs_max: int = 0
    last_start_s: float = 0.0  # the queue is empty from here on: the tail
    tail_compute_s: float = 0.0  # GPU-seconds of compute delivered in the tail

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(self.waits_s)

    @property
    def mean_turnaround_s(self) -> float:
        return statistics.fmean(self.turnarounds_s)

    @property
    def p95_wait_s(self) -> float:
        ordered = sorted(self.waits_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def simulate(  # noqa: PLR0917  (keyword use in this file; defaults are the benchmark's)
    trace: Sequence[TraceJob],
    policy: Policy,
    foreign: Sequence[Foreign] = (),
    gpus: int = GPU_COUNT,
    gpu_mem: int = GPU_MEM,
    headroom: int = HEADROOM,
    timeline: list[tuple[float, int, list[float], dict[int, str]]] | None = None,
) -> SimResult:
    uuids = [f"GPU-sim-{i}" for i in range(gpus)]
    arrivals = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
    next_arrival = 0
    origin: dict[int, TraceJob] = {}
    queue: dict[int, TraceJob] = {}  # sim id -> job, in submit order
    running: dict[int, _Run] = {}
    next_sim_id = max(j.job_id for j in trace) + 1
    foreign_events = sorted(
        [(f.start_s, 1, i) for i, f in enumerate(foreign)]
        + [(f.end_s, 0, i) for i, f in enumerate(foreign)]
    )
    next_foreign = 0
    foreign_on: dict[int, Foreign] = {}
    finished: dict[int, float] = {}
    started: dict[int, float] = {}  # original job id -> start of its last (successful) run
    placed_at: dict[int, float] = {}
    oom = oom_foreign = refused = plan_calls = starts = max_jobs = 0
    plan_s = mem_used = mem_reserved = compute_used = tail_compute = last_start = 0.0
    t = 0.0

    def real_used(gpu: int) -> int:
        jobs = sum(r.job.peak_bytes for r in running.values() if r.gpu == gpu and r.allocated)
        return jobs + sum(f.bytes for f in foreign_on.values() if f.gpu == gpu)

    def demand(gpu: int) -> float:
        return sum(r.job.demand for r in running.values() if r.gpu == gpu)

    def busy_demand(gpu: int) -> float:
        """What the GPU's utilization shows: jobs computing once they have allocated."""
        return sum(r.job.demand for r in running.values() if r.gpu == gpu and r.allocated)

    def rate(gpu: int) -> float:
        return min(1.0, 1.0 / max(demand(gpu), EPS))

    while next_arrival < len(arrivals) or queue or running:
        # -- one scheduling pass, as Scheduler.tick() makes it ---------------------------------
        if queue:
            slots = [
                GpuSlot(
                    uuids[g],
                    g,
                    gpu_mem,
                    gpu_mem - real_used(g) if policy.measure_free else gpu_mem,
                    util_percent=100 * min(1.0, busy_demand(g)),
                )
                for g in range(gpus)
            ]
            claims = [
                RunningClaim(
                    r.sim_id,
                    (uuids[r.gpu],),
                    None if policy.whole_gpu else r.job.declared_bytes,
                    {uuids[r.gpu]: r.job.peak_bytes if r.allocated else 0}
                    if policy.observe_usage
                    else {},
                    util_percent=100 * r.job.demand * rate(r.gpu) if r.allocated else None,
                )
                for r in running.values()
            ]
            waiting = [
                # An OOM-killed job's retry keeps its place in the queue (queue_order), as
                # gpusched's own retry does.
                WaitingJob(
                    sim_id,
                    None if policy.whole_gpu else job.declared_bytes,
                    queue_order=job.job_id,
                )
                for sim_id, job in queue.items()
            ]
            begin = time.perf_counter()
            result = plan(
                slots,
                claims,
                waiting,
                headroom,
                policy.max_jobs_per_gpu,
                busy_util=policy.busy_util,
            )
            plan_s += time.perf_counter() - begin
            plan_calls += 1
            if timeline is not None:
                timeline.append(
                    (t, len(queue), [demand(g) for g in range(gpus)], result.waiting_reasons)
                )
            for placement in result.placements:
                job = queue.pop(placement.job_id)
                gpu = uuids.index(placement.gpu_uuids[0])
                running[placement.job_id] = _Run(job, placement.job_id, gpu, t, job.duration_s)
                placed_at[placement.job_id] = t
                started[job.job_id] = t
                last_start = t
                starts += 1
            for g in range(gpus):
                max_jobs = max(max_jobs, sum(1 for r in running.values() if r.gpu == g))

        # -- the next event ---------------------------------------------------------------------
        rates = {g: rate(g) for g in range(gpus)}
        candidates = []
        if next_arrival < len(arrivals):
            candidates.append(arrivals[next_arrival].arrival_s)
        if next_foreign < len(foreign_events):
            candidates.append(foreign_events[next_foreign][0])
        for r in running.values():
            candidates.append(t + r.remaining_s / rates[r.gpu])
            if not r.allocated:
                candidates.append(r.start_s + ALLOC_LAG_S)
        if not candidates:
            raise RuntimeError(f"{policy.name}: {len(queue)} jobs can never start")
        t_next = max(t, min(candidates))
        dt = t_next - t
        for g in range(gpus):
            on_gpu = [r for r in running.values() if r.gpu == g]
            mem_used += dt * sum(r.job.peak_bytes for r in on_gpu if r.allocated)
            if any(policy.whole_gpu for _ in on_gpu):
                mem_reserved += dt * gpu_mem
            else:
                mem_reserved += dt * sum(r.job.declared_bytes for r in on_gpu)
            delivered = dt * min(1.0, sum(r.job.demand for r in on_gpu))
            compute_used += delivered
            if not queue and next_arrival == len(arrivals):
                tail_compute += delivered
        for r in running.values():
            r.remaining_s -= dt * rates[r.gpu]
        t = t_next

        # -- what happens at t: ends first (they free memory), then allocations, then the rest --
        for sim_id in [s for s, r in running.items() if r.remaining_s <= EPS * max(1.0, t)]:
            run = running.pop(sim_id)
            finished[run.job.job_id] = t
        for r in sorted(running.values(), key=lambda r: (r.start_s, r.sim_id)):
            if r.allocated or r.start_s + ALLOC_LAG_S > t + EPS:
                continue
            if real_used(r.gpu) + r.job.peak_bytes > gpu_mem:
                oom += 1
                if any(
                    f.gpu == r.gpu and f.start_s > placed_at[r.sim_id] for f in foreign_on.values()
                ):
                    oom_foreign += 1
                del running[r.sim_id]
                queue[next_sim_id] = r.job  # retried as a new job
                origin[next_sim_id] = r.job
                next_sim_id += 1
            else:
                r.allocated = True
        while next_foreign < len(foreign_events) and foreign_events[next_foreign][0] <= t + EPS:
            _, is_start, index = foreign_events[next_foreign]
            next_foreign += 1
            proc = foreign[index]
            if not is_start:
                foreign_on.pop(index, None)
            elif real_used(proc.gpu) + proc.bytes <= gpu_mem:
                foreign_on[index] = proc
            else:
                refused += 1  # the notebook gets the OOM, not a job
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrival_s <= t + EPS:
            job = arrivals[next_arrival]
            queue[job.job_id] = job
            next_arrival += 1

    waits = [started[j.job_id] - j.arrival_s for j in trace]
    return SimResult(
        policy=policy.name,
        makespan_s=max(finished.values()),
        waits_s=waits,
        turnarounds_s=[finished[j.job_id] - j.arrival_s for j in trace],
        mem_used_s=mem_used,
        mem_reserved_s=mem_reserved,
        compute_used_s=compute_used,
        oom_kills=oom,
        oom_after_foreign=oom_foreign,
        foreign_refused=refused,
        plan_calls=plan_calls,
        plan_s=plan_s,
        starts=starts,
        by_gpu_jobs_max=max_jobs,
        last_start_s=last_start,
        tail_compute_s=tail_compute,
    )


# -- reporting ----------------------------------------------------------------------------------


def print_table(results: Sequence[SimResult], bound_s: float, gpus: int, gpu_mem: int) -> None:
    head = (
        f"{'policy':<32}{'makespan h':>11}{'x bound':>8}{'mean wait h':>12}{'p95 wait h':>11}"
        f"{'mean turnaround h':>18}"
        f"{'mem used':>9}{'reserved':>9}{'idle':>6}{'compute':>8}{'OOM':>5}{'max/GPU':>8}"
        f"{'tail h':>7}{'tail compute':>13}"
    )
    print(head)
    print(f"{'lower bound':<32}{bound_s / 3600:>11.2f}{1.0:>8.3f}")
    for r in results:
        capacity = gpus * gpu_mem * r.makespan_s
        print(
            f"{r.policy:<32}{r.makespan_s / 3600:>11.2f}{r.makespan_s / bound_s:>8.3f}"
            f"{r.mean_wait_s / 3600:>12.2f}{r.p95_wait_s / 3600:>11.2f}"
            f"{r.mean_turnaround_s / 3600:>18.2f}"
            f"{r.mem_used_s / capacity:>9.1%}{r.mem_reserved_s / capacity:>9.1%}"
            f"{1 - r.mem_used_s / capacity:>6.0%}{r.compute_used_s / (gpus * r.makespan_s):>8.1%}"
            f"{r.oom_kills:>5}{r.by_gpu_jobs_max:>8}"
            f"{(r.makespan_s - r.last_start_s) / 3600:>7.2f}"
            f"{r.tail_compute_s / (gpus * max(1.0, r.makespan_s - r.last_start_s)):>13.1%}"
        )
    print(
        "  mem used / reserved / idle: GPU memory-time as a share of all GPUs' memory over the"
        " makespan;\n  turnaround: from a job's submit to its end;"
        " compute: GPU compute delivered as a share of capacity;"
        " max/GPU: most jobs seen sharing one GPU;\n  tail: from the last job's start (the"
        " queue is empty) to the end, and the compute delivered in it"
    )


def issue_targets(label: str, ours: SimResult, whole: SimResult, bound: float) -> list[Figure]:
    """The issue's two packing targets, for one policy."""
    vs_bound, speedup = ours.makespan_s / bound, whole.makespan_s / ours.makespan_s
    return [
        Figure(f"{label}: makespan / lower bound", vs_bound, "x", "<= 1.15", vs_bound <= 1.15),
        Figure(
            f"{label}: one-per-GPU makespan / its makespan", speedup, "x", ">= 1.5", speedup >= 1.5
        ),
    ]


def run_policies(
    trace: Sequence[TraceJob], foreign: Sequence[Foreign] = ()
) -> tuple[float, list[SimResult]]:
    bound = lower_bound_s(trace)
    return bound, [simulate(trace, policy, foreign) for policy in POLICIES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--window-h", type=float, default=DEFAULT_WINDOW_H)
    parser.add_argument("--seeds", type=int, default=5, help="extra seeds for the spread")
    args = parser.parse_args()
    window_s = args.window_h * 3600
    print(f"{GPU_COUNT} simulated GPUs x {GPU_MEM / GiB:.0f} GB, headroom {HEADROOM / 2**20:.0f}M,")
    print(f"allocation lag {ALLOC_LAG_S:.0f} s, seed {args.seed}")
    trace = make_trace(args.seed, args.jobs, window_s)
    stats = describe_trace(trace)

    began = time.perf_counter()
    bound, results = run_policies(trace)
    print("\n-- default trace (every job within its declaration, no other processes) --")
    print_table(results, bound, GPU_COUNT, GPU_MEM)
    by_name = {r.policy: r for r in results}
    ours, whole = by_name[GPUSCHED.name], by_name[ONE_PER_GPU.name]
    capped, busy = by_name[CAPPED.name], by_name[BUSY.name]
    calls = sum(r.plan_calls for r in results)
    plan_total = sum(r.plan_s for r in results)
    print(
        f"  plan() called {calls} times, {plan_total:.2f} s in all"
        f" ({1e3 * plan_total / calls:.2f} ms per call);"
        f" simulation {time.perf_counter() - began:.1f} s"
    )

    # busy_util is a threshold: how much does the figure depend on where it is set?
    print("\n-- busy_util on the default trace --")
    print(
        f"  {'busy_util':>9}  {'x bound':>7}  {'one-per-GPU / it':>16}  {'mean wait h':>11}"
        f"  {'mean turnaround h':>17}"
    )
    for threshold in BUSY_GRID:
        same = threshold == BUSY.busy_util  # already simulated above
        r = busy if same else simulate(trace, replace(BUSY, busy_util=threshold))
        print(
            f"  {threshold:>8g}%  {r.makespan_s / bound:>7.3f}"
            f"  {whole.makespan_s / r.makespan_s:>16.3f}"
            f"  {r.mean_wait_s / 3600:>11.2f}  {r.mean_turnaround_s / 3600:>17.2f}"
        )

    # The same trace with processes gpusched did not start (a notebook now and then).
    foreign = make_interference(args.seed, whole.makespan_s, mean_gap_s=3 * 3600)
    _, noisy = run_policies(trace, foreign)
    print(
        f"\n-- same trace with {len(foreign)} foreign processes (8-24 GB, 10 min-6 h,"
        " one every ~3 h on a random GPU) --"
    )
    print_table(noisy, bound, GPU_COUNT, GPU_MEM)
    for r in noisy:
        print(
            f"  {r.policy:<32} OOM kills {r.oom_kills} (of which {r.oom_after_foreign} after a"
            f" foreign process arrived in the job's allocation lag); notebooks refused"
            f" {r.foreign_refused}"
        )
    noisy_ours = {r.policy: r for r in noisy}[GPUSCHED.name]

    # Is the default seed typical? The same generator with other seeds.
    spread = []
    for seed in range(args.seed + 1, args.seed + 1 + args.seeds):
        other = make_trace(seed, args.jobs, window_s)
        lb = lower_bound_s(other)
        g = simulate(other, GPUSCHED)
        w = simulate(other, ONE_PER_GPU)
        c = simulate(other, CAPPED)
        b = simulate(other, BUSY)
        spread.append(
            (
                seed,
                g.makespan_s / lb,
                w.makespan_s / g.makespan_s,
                g.oom_kills + b.oom_kills,
                c.makespan_s / lb,
                w.makespan_s / c.makespan_s,
                w.makespan_s / lb,
                b.makespan_s / lb,
                w.makespan_s / b.makespan_s,
                b.mean_turnaround_s / g.mean_turnaround_s,
            )
        )
    if spread:
        print(
            "\n-- other seeds (same generator) --\n"
            "  seed       gpusched: x bound  one-per-GPU / it  OOM"
            "   max_jobs_per_gpu 4: x bound  one-per-GPU / it   one-per-GPU x bound"
            "   busy_util 100%: x bound  one-per-GPU / it  turnaround / gpusched's"
        )
        for row in spread:
            seed, vs_bound, speedup, kills, c_bound, c_speedup, w_bound = row[:7]
            b_bound, b_speedup, b_turn = row[7:]
            print(
                f"  {seed}  {vs_bound:17.3f}  {speedup:16.3f}  {kills:3d}"
                f"  {c_bound:26.3f}  {c_speedup:16.3f}  {w_bound:20.3f}"
                f"  {b_bound:22.3f}  {b_speedup:16.3f}  {b_turn:24.3f}"
            )
        for column, label in (
            (1, "gpusched x bound"),
            (2, "one-per-GPU / gpusched"),
            (7, "busy_util 100% x bound"),
            (8, "one-per-GPU / busy_util 100%"),
            (9, "busy_util 100% mean turnaround / gpusched's"),
        ):
            values = [row[column] for row in spread]
            print(
                f"  {label}: median {statistics.median(values):.3f},"
                f" range {min(values):.3f}-{max(values):.3f}"
            )

    figures = [
        Figure("trace jobs", stats["jobs"], "jobs"),
        Figure("lower bound makespan", bound / 3600, "h"),
        Figure("gpusched makespan", ours.makespan_s / 3600, "h"),
        Figure("one-job-per-GPU makespan", whole.makespan_s / 3600, "h"),
        Figure("declared-only makespan", by_name[DECLARED.name].makespan_s / 3600, "h"),
        *issue_targets("gpusched", ours, whole, bound),
        *issue_targets("busy_util 100%", busy, whole, bound),
        Figure("busy_util 100%: OOM kills", busy.oom_kills, "jobs", "0", busy.oom_kills == 0),
        Figure("gpusched mean turnaround", ours.mean_turnaround_s / 3600, "h"),
        Figure("busy_util 100%: mean turnaround", busy.mean_turnaround_s / 3600, "h"),
        Figure("one-per-GPU mean turnaround", whole.mean_turnaround_s / 3600, "h"),
        Figure("gpusched mean wait", ours.mean_wait_s / 3600, "h"),
        Figure("gpusched p95 wait", ours.p95_wait_s / 3600, "h"),
        Figure("one-per-GPU mean wait", whole.mean_wait_s / 3600, "h"),
        Figure("one-per-GPU p95 wait", whole.p95_wait_s / 3600, "h"),
        Figure("gpusched OOM kills", ours.oom_kills, "jobs", "0", ours.oom_kills == 0),
        Figure("gpusched OOM kills, with foreign processes", noisy_ours.oom_kills, "jobs"),
        Figure("ceiling: one-per-GPU makespan / lower bound", whole.makespan_s / bound, "x"),
        Figure("max_jobs_per_gpu 4: makespan / lower bound", capped.makespan_s / bound, "x"),
        Figure(
            "max_jobs_per_gpu 4: one-per-GPU / its makespan",
            whole.makespan_s / capped.makespan_s,
            "x",
        ),
    ]
    report("packing", figures)


if __name__ == "__main__":
    main()
