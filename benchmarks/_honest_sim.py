"""The honest packing benchmark's simulation: demand learned by the daemon's own code.

An event simulation as packing.py's (the same sharing model, OOM kills and retries sized
by the daemon's own `retry_mem`, fair share, headroom, the policy's own `plan()` through
`_packing_policies.place`), except for what the policy is told of demand. No oracle:
every running job has a `DemandTracker` (gpusched.usage.demand) fed, at every poll of the
daemon's default `poll_interval` (2 s), the readings the real monitor gets, built by its
`card_polls()` from simulated NVML figures:

- a card's utilization: min(100, the sum of the true demands of the jobs holding memory
  on it), in whole percent;
- each job's per-process figure: the share of the card's time it ran kernels, 100 x its
  demand x its speed (the sharing model), in whole percent; a job whose figure would be
  under FAINT_PERCENT has a sample in only one poll of FAINT_EVERY (FIELD.md: a 3 %-busy
  loop beside a busy one had a sample in 4 of 17 polls).

A job is polled only once it holds memory (the monitor's rule), ALLOC_LAG_S after it
starts; before that it loads data on the CPU at solo speed and uses no GPU time. Its
tracker starts without a prior, as the daemon's for a job it started (monitor.started).
The policy is told what the daemon tells it (pass_rules, policy_inputs): a running job's
tracker's `demand()`, else what `DemandHistory.estimate` says of its name and command;
a waiting job's `estimate`, its owner's latest runs' included. At a job's end its
tracker's demand is added to the history (monitor.finish), and that history carries over
to the next day when the benchmark asks (warm).

The state between two events is constant, so the polls between them are fed in one go
(each tracker's `observe()` once per poll). plan() runs at every event (a submit, an end,
an allocation), at every poll while a polled job's demand is still unknown, and every
REPLAN_S while jobs wait (fair share ages, averages move).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from _honest_trace import GPU_MEM, Job
from _packing_model import Load, speeds
from _packing_policies import Carry, Policy, Running, Waiting, place

from gpusched.core.models import GpuProcess, GpuState
from gpusched.scheduling.policy import GpuSlot, RunningClaim, UsageSpan, WaitingJob, decayed_usage
from gpusched.usage.demand import CardPoll, DemandTracker, card_polls
from gpusched.usage.demand_history import DemandHistory
from gpusched.usage.oom import retry_mem

POLL_S = 2.0  # the daemon's default poll_interval
HEADROOM = 512 * 2**20  # the default `headroom`
HALF_LIFE_S = 3600.0  # the default `fair_share_half_life`
ALLOC_LAG_S = 60.0  # a job allocates its memory this long after it starts (as packing.py)
EPS = 1e-6
FAINT_PERCENT = 10
FAINT_EVERY = 4
REPLAN_S = 60.0
UNKNOWN_POLLS = 20  # polls after its first that a job's unknown demand is replanned for
PID_BASE = 100_000
BUSY = 0.5  # the policy's BUSY_DEMAND


@dataclass
class Run:
    sim_id: int
    job: Job
    mem: int | None
    cards: tuple[int, ...]
    start_s: float
    remaining_s: float  # work left, in seconds at solo speed
    tracker: DemandTracker | None = None  # from its first allocation (its first poll)
    polls: int = 0


@dataclass
class Queued:
    sim_id: int
    job: Job
    mem: int | None


@dataclass
class DayResult:
    policy: Policy
    makespan_s: float
    slowdowns: list[float]
    waits_s: list[float]
    oom_kills: int
    plan_calls: int
    busy_in_window: float  # share of the cards' time over the window some job held them
    history: DemandHistory = field(repr=False)
    # How often the policy's demand for a starting job was wrong by kind (light vs busy).
    misjudged: int = 0
    unknown_at_start: int = 0
    # Per trace job, what the policy was told of its demand when its last run started:
    # "unknown", "right" or "wrong" (light told busy or busy told light, at BUSY).
    told: list[str] = field(default_factory=list)
    held_for_quiet: int = 0  # jobs plan() held for a quieter card at least once
    # (what its tracker read, its true demand) of every run that ended with a demand read
    learned: list[tuple[float, float]] = field(default_factory=list)

    @property
    def mean_slowdown(self) -> float:
        return statistics.fmean(self.slowdowns)

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(self.waits_s)

    @property
    def p95_wait_s(self) -> float:
        ordered = sorted(self.waits_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


class Day:
    """One policy's replay of one trace, from a given history."""

    def __init__(
        self,
        trace: Sequence[Job],
        policy: Policy,
        gpus: int,
        window_s: float,
        history: DemandHistory,
    ) -> None:
        self.policy, self.gpus, self.window_s, self.history = policy, gpus, window_s, history
        self.uuids = [f"GPU-sim-{i}" for i in range(gpus)]
        self.arrivals = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
        self.trace = list(trace)
        self.next_arrival = 0
        self.queue: dict[int, Queued] = {}
        self.running: dict[int, Run] = {}
        self.first_id: dict[int, int] = {}
        self.spans: list[UsageSpan] = []
        self.span_of: dict[int, int] = {}
        self.ended: dict[int, tuple[float, float]] = {}
        self.next_sim_id = max(j.job_id for j in trace) + 1
        self.oom = self.plan_calls = self.misjudged = self.unknown_at_start = 0
        self.told: dict[int, str] = {}  # trace job id -> what its last start was told
        self.held: set[int] = set()
        self.learned: list[tuple[float, float]] = []
        self.held_card_s = 0.0
        self.carry = Carry()
        self.t = 0.0
        self.last_plan = -math.inf

    # -- what the daemon knows ------------------------------------------------------------
    def expected(self, sim_id: int, job: Job) -> tuple[float | None, int]:
        return self.history.estimate(sim_id, job.uid, None, job.name, job.command)

    def running_demand(self, run: Run) -> float | None:
        measured = None if run.tracker is None else run.tracker.demand()
        return measured if measured is not None else self.expected(run.sim_id, run.job)[0]

    # -- the cards ------------------------------------------------------------------------
    def on_card(self, card: int) -> list[Run]:
        return [r for r in self.running.values() if card in r.cards]

    def polled(self, card: int) -> list[Run]:
        return [r for r in self.on_card(card) if r.tracker is not None]

    def rates(self) -> dict[int, float]:
        rate = {r.sim_id: 1.0 for r in self.running.values()}
        for card in range(self.gpus):
            on = self.polled(card)
            shares = speeds([Load(r.job.demand, r.job.memory_bound) for r in on])
            for r, s in zip(on, shares, strict=True):
                rate[r.sim_id] = min(rate[r.sim_id], s)
        return rate

    def real_used(self, card: int) -> int:
        return sum(r.job.peak_bytes for r in self.polled(card))

    # -- one plan ---------------------------------------------------------------------------
    def plan_now(self) -> None:
        self.last_plan = self.t
        slots = [
            GpuSlot(self.uuids[g], g, GPU_MEM, GPU_MEM - self.real_used(g))
            for g in range(self.gpus)
        ]
        claims = []
        for r in self.running.values():
            used = {self.uuids[g]: r.job.peak_bytes if r.tracker else 0 for g in r.cards}
            claim = RunningClaim(
                r.sim_id,
                tuple(self.uuids[g] for g in r.cards),
                r.mem,
                used,
                user=r.job.user,
                peak_bytes=r.job.peak_bytes if r.tracker else 0,
            )
            claims.append(Running(claim, self.running_demand(r)))
        waiting = [
            Waiting(
                WaitingJob(
                    q.sim_id,
                    q.mem,
                    gpu_count=min(q.job.gpus, self.gpus),
                    user=q.job.user,
                    queue_order=self.first_id.get(q.sim_id),
                ),
                *self.expected(q.sim_id, q.job),
            )
            for q in self.queue.values()
        ]
        users_waiting = len({q.job.user for q in self.queue.values()})
        usage = decayed_usage(self.spans, self.t, HALF_LIFE_S) if users_waiting > 1 else {}
        decision = place(
            self.policy,
            slots,
            claims,
            waiting,
            headroom=HEADROOM,
            user_usage=usage,
            carry=self.carry,
        )
        self.plan_calls += 1
        self.held.update(self.first_id.get(i, i) for i in decision.held_for_quiet)
        told = {w.job.job_id: w.demand for w in waiting}
        for placement in decision.placements:
            self.start(self.queue.pop(placement.job_id), placement.gpu_uuids, told)

    def start(self, q: Queued, gpu_uuids: Sequence[str], told: dict[int, float | None]) -> None:
        cards = tuple(self.uuids.index(u) for u in gpu_uuids)
        demand = told.get(q.sim_id)
        if demand is None:
            self.unknown_at_start += 1
            self.told[q.job.job_id] = "unknown"
        elif (demand >= BUSY) != (q.job.demand >= BUSY):
            self.misjudged += 1
            self.told[q.job.job_id] = "wrong"
        else:
            self.told[q.job.job_id] = "right"
        self.running[q.sim_id] = Run(q.sim_id, q.job, q.mem, cards, self.t, q.job.duration_s)
        held = len(cards) * (GPU_MEM if q.mem is None else q.mem)
        self.span_of[q.sim_id] = len(self.spans)
        self.spans.append(UsageSpan(q.job.user, held, self.t, None))

    # -- the polls between two events -------------------------------------------------------
    def readings(self, rate: dict[int, float], faint_sampled: bool) -> dict[int, list[CardPoll]]:
        """Each polled job's CardPolls of one poll, by the monitor's own card_polls()."""
        by_uuid: dict[str, GpuState] = {}
        processes: dict[int, dict[str, list[GpuProcess]]] = {}
        process_util: dict[str, dict[int, int]] = {}
        device: dict[str, float] = {}
        for g in range(self.gpus):
            uuid, on = self.uuids[g], self.polled(g)
            util = min(100, round(100 * sum(r.job.demand for r in on)))
            procs = tuple(GpuProcess(PID_BASE + r.sim_id, r.job.peak_bytes) for r in on)
            used = sum(r.job.peak_bytes for r in on)
            by_uuid[uuid] = GpuState(
                g, uuid, "H100", GPU_MEM, used, GPU_MEM - used, util, processes=procs
            )
            device[uuid] = float(util)
            samples = process_util.setdefault(uuid, {})
            for r, proc in zip(on, procs, strict=True):
                processes.setdefault(r.sim_id, {})[uuid] = [proc]
                figure = round(100 * r.job.demand * rate[r.sim_id])
                if figure >= FAINT_PERCENT or faint_sampled:
                    samples[proc.pid] = figure
        polls = card_polls(by_uuid, processes, process_util, device)
        return {job_id: list(per_gpu.values()) for job_id, per_gpu in polls.items()}

    def feed_polls(self, t_next: float, rate: dict[int, float]) -> None:
        first, last = math.floor(self.t / POLL_S) + 1, math.floor(t_next / POLL_S)
        if last < first or not any(r.tracker for r in self.running.values()):
            return
        count = last - first + 1
        faint = last // FAINT_EVERY - (first - 1) // FAINT_EVERY
        for sampled, n in ((True, faint), (False, count - faint)):
            if n <= 0:
                continue
            for job_id, polls in self.readings(rate, sampled).items():
                run = self.running[job_id]
                assert run.tracker is not None
                run.polls += n
                for _ in range(n):
                    for poll in polls:
                        run.tracker.observe(poll)

    # -- the loop -----------------------------------------------------------------------------
    def next_time(self, rate: dict[int, float]) -> float:
        candidates = []
        if self.next_arrival < len(self.arrivals):
            candidates.append(self.arrivals[self.next_arrival].arrival_s)
        for r in self.running.values():
            candidates.append(self.t + r.remaining_s / rate[r.sim_id])
            if r.tracker is None:
                candidates.append(r.start_s + ALLOC_LAG_S)
        if self.queue and (self.running or self.next_arrival < len(self.arrivals)):
            candidates.append(self.last_plan + REPLAN_S)
            learning = any(
                r.tracker is not None and r.polls < UNKNOWN_POLLS and r.tracker.demand() is None
                for r in self.running.values()
            )
            if learning:
                candidates.append((math.floor(self.t / POLL_S) + 1) * POLL_S)
        if not candidates:
            raise RuntimeError(f"{self.policy.name}: {len(self.queue)} jobs can never start")
        return max(self.t, min(candidates))

    def advance(self, t_next: float, rate: dict[int, float]) -> None:
        for r in self.running.values():
            r.remaining_s -= (t_next - self.t) * rate[r.sim_id]
        start, end = min(self.t, self.window_s), min(t_next, self.window_s)
        if end > start:
            held = sum(1 for g in range(self.gpus) if self.on_card(g))
            self.held_card_s += held * (end - start)
        self.feed_polls(t_next, rate)
        self.t = t_next

    def end_jobs(self) -> None:
        t = self.t
        for sim_id in [s for s, r in self.running.items() if r.remaining_s <= EPS * max(1.0, t)]:
            run = self.running.pop(sim_id)
            self.ended[run.job.job_id] = (t, t - run.start_s)
            self.close_span(sim_id)
            demand = None if run.tracker is None else run.tracker.demand()
            if demand is not None:
                job = run.job
                self.learned.append((demand, job.demand))
                self.history.add(
                    job_id=sim_id,
                    uid=job.uid,
                    array_id=None,
                    name=job.name,
                    command=job.command,
                    demand=demand,
                )

    def close_span(self, sim_id: int) -> None:
        i = self.span_of[sim_id]
        self.spans[i] = replace(self.spans[i], end_s=self.t)

    def allocate(self) -> None:
        t = self.t
        for r in sorted(self.running.values(), key=lambda r: (r.start_s, r.sim_id)):
            if r.tracker is not None or r.start_s + ALLOC_LAG_S > t + EPS:
                continue
            if any(self.real_used(g) + r.job.peak_bytes > GPU_MEM for g in r.cards):
                self.oom += 1
                del self.running[r.sim_id]
                self.close_span(r.sim_id)
                grown, _ = retry_mem(r.mem, len(r.cards), [GPU_MEM] * self.gpus, HEADROOM, None)
                if grown is None:
                    raise RuntimeError(f"job {r.job.job_id} can never fit: {r.job}")
                self.queue[self.next_sim_id] = Queued(self.next_sim_id, r.job, grown)
                self.first_id[self.next_sim_id] = self.first_id.get(r.sim_id, r.sim_id)
                self.next_sim_id += 1
            else:
                # As UsageMonitor.started: what its kind's runs demanded is its floor.
                r.tracker = DemandTracker(prior=self.expected(r.sim_id, r.job)[0])

    def submit(self) -> None:
        while (
            self.next_arrival < len(self.arrivals)
            and self.arrivals[self.next_arrival].arrival_s <= self.t + EPS
        ):
            job = self.arrivals[self.next_arrival]
            declared = None if self.policy.whole_gpu else job.declared_bytes
            self.queue[job.job_id] = Queued(job.job_id, job, declared)
            self.next_arrival += 1

    def run(self) -> DayResult:
        while self.next_arrival < len(self.arrivals) or self.queue or self.running:
            if self.queue:
                self.plan_now()
            rate = self.rates()
            self.advance(self.next_time(rate), rate)
            self.end_jobs()
            self.allocate()
            self.submit()
        ended = self.ended
        return DayResult(
            policy=self.policy,
            makespan_s=max(end for end, _ in ended.values()),
            slowdowns=[ended[j.job_id][1] / j.duration_s for j in self.trace],
            waits_s=[ended[j.job_id][0] - j.arrival_s - ended[j.job_id][1] for j in self.trace],
            oom_kills=self.oom,
            plan_calls=self.plan_calls,
            busy_in_window=self.held_card_s / (self.gpus * self.window_s),
            history=self.history,
            misjudged=self.misjudged,
            unknown_at_start=self.unknown_at_start,
            told=[self.told[j.job_id] for j in self.trace],
            held_for_quiet=len(self.held),
            learned=self.learned,
        )
