"""Watching running jobs: their GPU memory and utilization, poll by poll, in memory.

The scheduler's tick hands `UsageMonitor.observe()` what it already computed (each running
job's processes on each GPU, from one scan of the process table) plus, where the driver
samples it, the utilization of each process. The monitor keeps one `UsageTracker` per
running job and writes to the database only:

- every `FLUSH_INTERVAL_S` per job (the tracker's state, so a restarted daemon carries
  the figures on instead of starting them afresh; `show` reads live figures meanwhile),
- and at the job's end (the scheduler asks `finish()` for the final columns and writes
  them in the same transaction as the end itself).

Each job's time series (gpusched.usage.timeline) is fed at every poll too, and its new
points ride on the same writes: the flush and the end (`final_timeline()`).

The peak is written whenever it rises (`store.usage.record_usage`), so `show` and the OOM
retry see it at once; it is the tracker's, never a second copy kept elsewhere.
A job is sampled only while it holds GPU memory: before its first allocation it is still
starting (loading data, building the model), and counting those polls as 0 % busy would
blame the GPU for the CPU's start-up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from gpusched.core.hints import JobFacts, over_declared_hint
from gpusched.core.models import GpuHealth, GpuProcess, GpuState, Job, TimelinePoint
from gpusched.core.units import format_size
from gpusched.store import Queued, Timeline, TimelineWrite, Usage
from gpusched.usage.attribution import Outsider
from gpusched.usage.demand import CardPoll, card_polls
from gpusched.usage.demand_history import DemandHistory
from gpusched.usage.timeline import TimelineBuffer
from gpusched.usage.tracker import UsageTracker, job_utilization, overrun_limit, smooth

FLUSH_INTERVAL_S = 60.0
HISTORY_TTL_S = 60.0

# job id -> GPU uuid -> the job's processes holding memory there
JobProcesses = Mapping[int, Mapping[str, Sequence[GpuProcess]]]


@dataclass(frozen=True)
class _Poll:
    """What one poll read, for every running job at once: each job's steps read it, none
    changes it."""

    now_s: float
    now_iso: str
    by_uuid: Mapping[str, GpuState]
    process_util: Mapping[str, Mapping[int, int]] | None
    cards: Mapping[int, Mapping[str, CardPoll]]  # job id -> GPU uuid -> its view of the card
    alone: Mapping[int, set[str]]  # job id -> the GPUs it has to itself
    margin_fraction: float
    margin_bytes: int
    outsiders: Mapping[str, Outsider]  # GPU uuid -> its largest process gpusched did not start

    def index(self, uuid: str) -> int:
        """A GPU's index; -1 for one this poll did not read."""
        gpu = self.by_uuid.get(uuid)
        return -1 if gpu is None else gpu.index


@dataclass(frozen=True)
class Overrun:
    """A running job first seen holding more than its declared memory plus the margin."""

    job: Job
    gpu_index: int
    used_bytes: int
    limit_bytes: int
    given: bool = True  # False: memory on a GPU the job was not given

    def hint(self) -> str | None:
        if not self.given:
            return (
                f"it used GPU {self.gpu_index}, which it was not given: use only the GPUs in"
                " CUDA_VISIBLE_DEVICES (gpusched sets it), or ask for more with --gpus"
            )
        return over_declared_hint(
            JobFacts(
                mem=self.job.mem,
                state="running",
                reason=None,
                runtime_s=None,
                peak_mem=self.used_bytes,
            )
        )

    def describe(self) -> str:
        if not self.given:
            return (
                f"job {self.job.id} uses {format_size(self.used_bytes)} on GPU {self.gpu_index},"
                " a GPU it was not given (it holds memory other jobs were promised)"
            )
        return (
            f"job {self.job.id} uses {format_size(self.used_bytes)} on GPU {self.gpu_index},"
            f" more than its declared {format_size(self.job.mem)}"
            f" (the limit with the overrun margin is {format_size(self.limit_bytes)})"
        )


class UsageMonitor:
    def __init__(
        self,
        usage: Usage,
        timelines: Timeline,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.usage = usage
        self.stored_timelines = timelines
        self.flush_interval_s = flush_interval_s
        self._trackers: dict[int, UsageTracker] = {}
        self._timelines: dict[int, TimelineBuffer] = {}
        self._flushed_at_s: dict[int, float] = {}
        self._gpu_util: dict[str, float] = {}  # uuid -> recent utilization of the whole GPU
        self._monotonic = monotonic
        self._history: tuple[float, DemandHistory] | None = None  # (when read, what)

    def tracker(self, job: Job) -> UsageTracker:
        """The job's tracker, picked up from the database the first time (after a restart)."""
        tracker = self._trackers.get(job.id)
        if tracker is None:
            tracker = UsageTracker.from_state(self.usage.usage_state(job.id))
            tracker.peak_mem = max(tracker.peak_mem, job.peak_mem or 0)
            if tracker.sharing.prior is None:
                # Its turns on a saturated card only bound its demand from below: what
                # its kind's runs demanded keeps those turns from reading it lighter.
                tracker.sharing.prior = self.expected(job)[0]
            self._trackers[job.id] = tracker
        return tracker

    def timeline(self, job: Job) -> TimelineBuffer:
        """The job's time series, picked up from the database the first time (after a restart)."""
        buffer = self._timelines.get(job.id)
        if buffer is None:
            state = self.usage.usage_state(job.id) or {}
            buffer = TimelineBuffer.restore(
                state.get("timeline"), self.stored_timelines.timeline_rows(job.id)
            )
            self._timelines[job.id] = buffer
        return buffer

    def started(self, job: Job) -> None:
        """A job this daemon has just started: nothing of it is stored yet, so its tracker
        starts empty here instead of being looked for in the database at its first poll or
        at its end (a read per job, on the path from one job's end to the next's start).
        What its kind's runs demanded is its floor, as for a tracker read back (`tracker`);
        the history is the one the pass that placed it has just read."""
        if job.id not in self._trackers:
            tracker = UsageTracker()
            tracker.sharing.prior = self.expected(job)[0]
            self._trackers[job.id] = tracker
        self._timelines.setdefault(job.id, TimelineBuffer(math.nan))  # starts at its first poll

    def live_timeline(self, job_id: int) -> list[TimelinePoint] | None:
        """A running job's whole series so far (what is stored and what is not yet)."""
        buffer = self._timelines.get(job_id)
        return None if buffer is None else buffer.snapshot()

    def final_timeline(self, job_id: int) -> TimelineWrite | None:
        """The points of an ending job that the store lacks; forgets its series."""
        buffer = self._timelines.pop(job_id, None)
        return None if buffer is None else buffer.pending(final=True)

    def live(self, job_id: int) -> UsageTracker | None:
        return self._trackers.get(job_id)

    def job_util(self, job_id: int) -> float | None:
        """A running job's recent utilization; None until it has used its GPU."""
        tracker = self._trackers.get(job_id)
        return None if tracker is None else tracker.util_recent

    def peak(self, job_id: int) -> int | None:
        """The most a running job was seen holding on one GPU (None: not seen yet)."""
        tracker = self._trackers.get(job_id)
        return tracker.peak_mem if tracker is not None and tracker.peak_mem else None

    def job_demand(self, job_id: int) -> float | None:
        """A running job's demand so far (0.0-1.0 of a card's busy time; see
        gpusched.usage.demand), None until it is known."""
        tracker = self._trackers.get(job_id)
        return None if tracker is None else tracker.sharing.demand()

    def expected_demand(self, job: Job | Queued) -> float | None:
        """What a job is expected to demand: its own figure while it runs, else the median
        of its past runs' (the same sweep, else --name, else command, of the same owner),
        else its owner's latest ended runs' when all were busy (gpusched.usage.demand_history).

        The history is read at most once a HISTORY_TTL_S, in one query: a pass asks for
        every waiting job."""
        live = self.job_demand(job.id)
        if live is not None:
            return live
        return self.expected(job)[0]

    def expected(self, job: Job | Queued) -> tuple[float | None, int]:
        """A job's expected demand from history and, when it is its owner's latest runs',
        how many (0: its own runs; see `DemandHistory.estimate`)."""
        command = job.command_json if isinstance(job, Queued) else job.command
        history = self.demand_history()
        return history.estimate(
            job.id,
            job.uid,
            job.array_id,
            job.name,
            command,
            share=bool(job.share),
            interactive=bool(job.interactive),
        )

    def demand_history(self) -> DemandHistory:
        """The recorded demands by kind of job, read at most once a HISTORY_TTL_S."""
        now = self._monotonic()
        if self._history is None or now - self._history[0] > HISTORY_TTL_S:
            self._history = (now, DemandHistory(self.usage.demand_records()))
        return self._history[1]

    def gpu_util(self, uuid: str) -> float | None:
        """A GPU's recent utilization (every process on it), None when never read."""
        return self._gpu_util.get(uuid)

    def observe_gpus(self, gpus: Iterable[GpuState]) -> None:
        """One poll of the GPUs' own utilization (every process's), jobs or not."""
        for gpu in gpus:
            if gpu.util_percent is None or gpu.health != GpuHealth.OK:
                self._gpu_util.pop(gpu.uuid, None)
            else:
                self._gpu_util[gpu.uuid] = smooth(self._gpu_util.get(gpu.uuid), gpu.util_percent)

    def observe(
        self,
        *,
        now_s: float,
        now_iso: str,
        gpus: Iterable[GpuState],
        running: Iterable[Job],
        processes: JobProcesses,
        process_util: Mapping[str, Mapping[int, int]] | None,
        margin_fraction: float,
        margin_bytes: int,
        outsiders: Mapping[str, Outsider] | None = None,
    ) -> list[Overrun]:
        """One poll: feed every running job's tracker; return the jobs newly over their limit.
        `outsiders`: per GPU, its largest process gpusched did not start (attribution)."""
        poll = _read_poll(
            now_s=now_s,
            now_iso=now_iso,
            gpus=gpus,
            processes=processes,
            process_util=process_util,
            margin_fraction=margin_fraction,
            margin_bytes=margin_bytes,
            outsiders=outsiders or {},
        )
        overruns: list[Overrun] = []
        alive: set[int] = set()
        for job in running:
            alive.add(job.id)
            per_gpu = processes.get(job.id)
            if not per_gpu:
                continue
            overrun = self._observe_job(job, per_gpu, poll)
            if overrun is not None:
                overruns.append(overrun)
        self._forget_all_but(alive)
        return overruns

    def _observe_job(
        self, job: Job, per_gpu: Mapping[str, Sequence[GpuProcess]], poll: _Poll
    ) -> Overrun | None:
        """One poll of a job holding GPU memory: its memory, utilization, cards, timeline,
        overrun and, when due, the flush; returns the overrun when it is new."""
        tracker = self.tracker(job)
        held = {uuid: sum(p.used_bytes or 0 for p in procs) for uuid, procs in per_gpu.items()}
        if tracker.observe_memory(held, _fullest_card(held, poll.by_uuid, poll.outsiders)):
            self.usage.record_usage(job.id, tracker.peak_mem)
        util = _utilization(job.id, per_gpu, poll)  # after the memory: see _utilization
        if util is not None:
            tracker.observe_util(util)
        tracker.observe_cards(poll.cards.get(job.id, {}).values())
        self.timeline(job).add(poll.now_s, sum(held.values()), util)
        overrun = _new_overrun(job, tracker, held, poll)
        self._flush_when_due(job.id, poll.now_s)
        return overrun

    def _flush_when_due(self, job_id: int, now_s: float) -> None:
        """Flush a job every `flush_interval_s`, counted from its first poll here."""
        first = self._flushed_at_s.setdefault(job_id, now_s)
        if now_s - first >= self.flush_interval_s:
            self.flush(job_id)
            self._flushed_at_s[job_id] = now_s

    def _forget_all_but(self, alive: set[int]) -> None:
        """Drop what is kept of jobs no longer running that ended without finish() (never
        expected)."""
        for job_id in (set(self._trackers) | set(self._timelines)) - alive:
            self._trackers.pop(job_id, None)
            self._timelines.pop(job_id, None)
            self._flushed_at_s.pop(job_id, None)

    def flush_all(self) -> None:
        """Write every running job's figures and timeline, its open last point too: the
        daemon is stopping, and what only its memory holds would be a hole in the chart
        (up to FLUSH_INTERVAL_S) after the restart."""
        for job_id in list(self._trackers):
            self.flush(job_id, final=True)

    def flush(self, job_id: int, final: bool = False) -> None:
        """Write the job's figures so far and its new timeline points: one transaction.
        `final`: the point still gathering polls too (a restored buffer starts a new one)."""
        tracker = self._trackers.get(job_id)
        if tracker is None:
            return
        values = self.columns(tracker)
        buffer = self._timelines.get(job_id)
        write = None
        if buffer is not None:
            values["usage_state"] = {**tracker.to_state(), "timeline": buffer.to_state()}
            write = buffer.pending(final=final)
        self.usage.set_usage(job_id, timeline=write, **values)
        if buffer is not None and write is not None:
            buffer.committed(write)

    @staticmethod
    def columns(tracker: UsageTracker) -> dict[str, object]:
        """The store columns for a tracker (the peak has its own writer)."""
        values: dict[str, object] = dict(tracker.summary())
        values.pop("peak_mem")
        values["usage_state"] = tracker.to_state()
        values["overrun_at"] = tracker.overrun_at
        return values

    def finish(self, job: Job) -> UsageTracker:
        """The job's final tracker (from memory, else from the database); forgets it."""
        self._flushed_at_s.pop(job.id, None)
        tracker = self._trackers.pop(job.id, None)
        if tracker is None:
            tracker = UsageTracker.from_state(self.usage.usage_state(job.id))
        tracker.peak_mem = max(tracker.peak_mem, job.peak_mem or 0)
        demand = tracker.sharing.demand()
        if demand is not None and self._history is not None:
            self._history[1].add(
                job_id=job.id,
                uid=job.uid,
                array_id=job.array_id,
                name=job.name,
                command=job.command,
                demand=demand,
                interactive=bool(job.interactive),
            )
        return tracker


def _read_poll(
    *,
    now_s: float,
    now_iso: str,
    gpus: Iterable[GpuState],
    processes: JobProcesses,
    process_util: Mapping[str, Mapping[int, int]] | None,
    margin_fraction: float,
    margin_bytes: int,
    outsiders: Mapping[str, Outsider],
) -> _Poll:
    """This poll's GPUs by uuid, each job's view of its cards, and the GPUs each job has
    to itself."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    # This poll's own device figures, not the smoothed ones: a smoothed figure lags a
    # job's start and end by several polls (on an H100 a busy job alone read 0.72 of
    # its card, and two busy jobs sharing one read as unsaturated for most of their run).
    device_now = {
        gpu.uuid: float(gpu.util_percent)
        for gpu in by_uuid.values()
        if gpu.util_percent is not None and gpu.health == GpuHealth.OK
    }
    cards = card_polls(by_uuid, processes, process_util, device_now)
    alone = {
        job_id: {uuid for uuid, poll in polls.items() if not poll.neighbours and not poll.outsiders}
        for job_id, polls in cards.items()
    }
    return _Poll(
        now_s=now_s,
        now_iso=now_iso,
        by_uuid=by_uuid,
        process_util=process_util,
        cards=cards,
        alone=alone,
        margin_fraction=margin_fraction,
        margin_bytes=margin_bytes,
        outsiders=outsiders,
    )


def _utilization(
    job_id: int, per_gpu: Mapping[str, Sequence[GpuProcess]], poll: _Poll
) -> float | None:
    """The job's utilization at this poll, over its processes still alive.

    Utilization is sampled after the memory: a process that exited in between is missing
    from the samples, which would read as 0 % busy. Leave it out.
    """
    live_pids = {
        uuid: pids
        for uuid, procs in per_gpu.items()
        if (pids := [p.pid for p in procs if _alive(p.pid)])
    }
    return job_utilization(
        live_pids,
        poll.process_util,
        {uuid: poll.by_uuid[uuid].util_percent for uuid in live_pids if uuid in poll.by_uuid},
        alone_on=poll.alone.get(job_id, ()),
    )


def _new_overrun(
    job: Job, tracker: UsageTracker, held: Mapping[str, int], poll: _Poll
) -> Overrun | None:
    """The job's overrun when this poll is the first to see one (the tracker then marks
    it): memory on a GPU it was not given, else more than its declared memory plus the
    margin. None when there is none, or one was already seen."""
    if tracker.overrun_at is not None:
        return None
    overrun = _on_a_gpu_not_given(job, held, poll)
    if overrun is None:
        overrun = _over_declared(job, held, poll)
    if overrun is not None:
        tracker.overrun_at = poll.now_iso
    return overrun


def _on_a_gpu_not_given(job: Job, held: Mapping[str, int], poll: _Poll) -> Overrun | None:
    """Memory on a GPU the job was not given is an overrun there, whatever it declared."""
    elsewhere = [(u, used) for u, used in held.items() if u not in job.gpu_uuids and used]
    if not elsewhere:
        return None
    uuid, used = max(elsewhere, key=lambda item: item[1])
    return Overrun(job, poll.index(uuid), used, 0, given=False)


def _over_declared(job: Job, held: Mapping[str, int], poll: _Poll) -> Overrun | None:
    """More than the job declared plus the margin, on its fullest GPU (None: no --mem)."""
    if job.mem is None:
        return None
    limit = overrun_limit(job.mem, poll.margin_fraction, poll.margin_bytes)
    over = [(uuid, used) for uuid, used in held.items() if used > limit]
    if not over:
        return None
    uuid, used = max(over, key=lambda item: item[1])
    return Overrun(job, poll.index(uuid), used, limit)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _fullest_card(
    held: Mapping[str, int], by_uuid: Mapping[str, GpuState], outsiders: Mapping[str, Outsider]
) -> dict[str, int] | None:
    """Of the GPUs the job holds memory on, the one with the least free (oom.CardSeen),
    with the largest process there gpusched did not start, if any."""
    seen = [
        (gpu.free_bytes, gpu.index, gpu.total_bytes, used, uuid)
        for uuid, used in held.items()
        if used and (gpu := by_uuid.get(uuid)) is not None
    ]
    if not seen:
        return None
    free, index, total, used, uuid = min(seen)
    card = {"index": index, "free_bytes": free, "total_bytes": total, "held_bytes": used}
    other = outsiders.get(uuid)
    if other is not None:
        card.update(other_pid=other.pid, other_bytes=other.all_bytes)
        if other.uid is not None:
            card["other_uid"] = other.uid
    return card
