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

The peak is written whenever it rises (`Store.record_usage`), so `show` and the OOM
retry see it at once; it is the tracker's, never a second copy kept elsewhere.
A job is sampled only while it holds GPU memory: before its first allocation it is still
starting (loading data, building the model), and counting those polls as 0 % busy would
blame the GPU for the CPU's start-up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psutil

from gpusched.core.hints import JobFacts, job_hints, over_declared_hint
from gpusched.core.models import GpuHealth, GpuProcess, GpuState, Job, TimelinePoint
from gpusched.core.units import format_size
from gpusched.store import Store, TimelineWrite
from gpusched.usage.joblog import read_tail
from gpusched.usage.timeline import TimelineBuffer
from gpusched.usage.tracker import (
    UsageTracker,
    at_card_limit,
    job_utilization,
    oom_in_log,
    overrun_limit,
    smooth,
)

FLUSH_INTERVAL_S = 60.0

# job id -> GPU uuid -> the job's processes holding memory there
JobProcesses = Mapping[int, Mapping[str, Sequence[GpuProcess]]]


@dataclass(frozen=True)
class Overrun:
    """A running job first seen holding more than its declared memory plus the margin."""

    job: Job
    gpu_index: int
    used_bytes: int
    limit_bytes: int

    def hint(self) -> str | None:
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
        return (
            f"job {self.job.id} uses {format_size(self.used_bytes)} on GPU {self.gpu_index},"
            f" more than its declared {format_size(self.job.mem)}"
            f" (the limit with the overrun margin is {format_size(self.limit_bytes)})"
        )


class UsageMonitor:
    def __init__(self, store: Store, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self._trackers: dict[int, UsageTracker] = {}
        self._timelines: dict[int, TimelineBuffer] = {}
        self._flushed_at_s: dict[int, float] = {}
        self._gpu_util: dict[str, float] = {}  # uuid -> recent utilization of the whole GPU

    def tracker(self, job: Job) -> UsageTracker:
        """The job's tracker, picked up from the database the first time (after a restart)."""
        tracker = self._trackers.get(job.id)
        if tracker is None:
            tracker = UsageTracker.from_state(self.store.usage_state(job.id))
            tracker.peak_mem = max(tracker.peak_mem, job.peak_mem or 0)
            self._trackers[job.id] = tracker
        return tracker

    def timeline(self, job: Job) -> TimelineBuffer:
        """The job's time series, picked up from the database the first time (after a restart)."""
        buffer = self._timelines.get(job.id)
        if buffer is None:
            state = self.store.usage_state(job.id) or {}
            buffer = TimelineBuffer.restore(state.get("timeline"), self.store.timeline_rows(job.id))
            self._timelines[job.id] = buffer
        return buffer

    def started(self, job_id: int) -> None:
        """A job this daemon has just started: nothing of it is stored yet, so its tracker
        starts empty here instead of being looked for in the database at its first poll or
        at its end (a read per job, on the path from one job's end to the next's start)."""
        self._trackers.setdefault(job_id, UsageTracker())
        self._timelines.setdefault(job_id, TimelineBuffer(math.nan))  # starts at its first poll

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
    ) -> list[Overrun]:
        """One poll: feed every running job's tracker; return the jobs newly over their limit."""
        by_uuid = {gpu.uuid: gpu for gpu in gpus}
        overruns: list[Overrun] = []
        alive: set[int] = set()
        for job in running:
            alive.add(job.id)
            per_gpu = processes.get(job.id)
            if not per_gpu:
                continue
            tracker = self.tracker(job)
            held = {uuid: sum(p.used_bytes or 0 for p in procs) for uuid, procs in per_gpu.items()}
            if tracker.observe_memory(held, _full_card(held, by_uuid)):
                self.store.record_usage(job.id, tracker.peak_mem)
            # Utilization is sampled after the memory: a process that exited in between
            # is missing from the samples, which would read as 0 % busy. Leave it out.
            live_pids = {
                uuid: pids
                for uuid, procs in per_gpu.items()
                if (pids := [p.pid for p in procs if _alive(p.pid)])
            }
            util = job_utilization(
                live_pids,
                process_util,
                {uuid: by_uuid[uuid].util_percent for uuid in live_pids if uuid in by_uuid},
            )
            if util is not None:
                tracker.observe_util(util)
            self.timeline(job).add(now_s, sum(held.values()), util)
            if job.mem is not None and tracker.overrun_at is None:
                limit = overrun_limit(job.mem, margin_fraction, margin_bytes)
                over = [(uuid, used) for uuid, used in held.items() if used > limit]
                if over:
                    tracker.overrun_at = now_iso
                    uuid, used = max(over, key=lambda item: item[1])
                    index = by_uuid[uuid].index if uuid in by_uuid else -1
                    overruns.append(Overrun(job, index, used, limit))
            first = self._flushed_at_s.setdefault(job.id, now_s)
            if now_s - first >= self.flush_interval_s:
                self.flush(job.id)
                self._flushed_at_s[job.id] = now_s
        for job_id in (set(self._trackers) | set(self._timelines)) - alive:
            # ended without finish() (never expected)
            self._trackers.pop(job_id, None)
            self._timelines.pop(job_id, None)
            self._flushed_at_s.pop(job_id, None)
        return overruns

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
        self.store.set_usage(job_id, timeline=write, **values)
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
            tracker = UsageTracker.from_state(self.store.usage_state(job.id))
        tracker.peak_mem = max(tracker.peak_mem, job.peak_mem or 0)
        return tracker


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _full_card(held: Mapping[str, int], by_uuid: Mapping[str, GpuState]) -> str | None:
    """Which of the job's GPUs sits at its memory limit, in words; None if none does."""
    for uuid, used in held.items():
        gpu = by_uuid.get(uuid)
        if gpu is not None and used and at_card_limit(gpu.free_bytes, gpu.total_bytes):
            return (
                f"GPU {gpu.index} was full: {format_size(gpu.free_bytes)} of"
                f" {format_size(gpu.total_bytes)} free, the job holding {format_size(used)}"
            )
    return None


# -- how a job ended: out of memory?, its retry, its final figures ----------------------------

RETRY_GROWTH = 1.5


def oom_cause(job: Job, tracker: UsageTracker | None) -> str | None:
    """Why a job that failed looks out of GPU memory (its log's end, else a full card)."""
    line = oom_in_log(read_tail(job.log_path))
    if line is not None:
        return f"out of GPU memory: {line}"
    if tracker is not None and tracker.at_limit:
        return f"out of GPU memory: it died while {tracker.at_limit}"
    return None


def retry_mem(job: Job, gpus: Sequence[GpuState], headroom_bytes: int) -> tuple[int | None, str]:
    """The --mem of an OOM retry (1.5x, capped at what the largest GPUs give), or why none."""
    if job.mem is None:
        return None, "it already had a whole GPU"
    sizes = sorted(
        (g.total_bytes - headroom_bytes for g in gpus if g.health != GpuHealth.EXCLUDED),
        reverse=True,
    )
    if len(sizes) < job.gpus:
        return None, f"fewer than {job.gpus} GPUs are left"
    cap = sizes[job.gpus - 1]
    wanted = math.ceil(job.mem * RETRY_GROWTH / 2**20) * 2**20
    mem = min(wanted, cap)
    if mem <= job.mem:
        return None, f"{format_size(job.mem)} is already the most a GPU here gives"
    return mem, ""


def final_usage(
    job: Job,
    tracker: UsageTracker,
    *,
    state: str,
    reason: str,
    ended_at: str,
    min_runtime_s: float,
    card_bytes: int | None,
    retry: Job | None = None,
    retry_refused: str | None = None,
    oom_next_mem: int | None = None,
) -> dict[str, Any]:
    """The store columns written with a job's end: its figures and its hints."""
    runtime = None
    if job.started_at is not None:
        runtime = (
            datetime.fromisoformat(ended_at) - datetime.fromisoformat(job.started_at)
        ).total_seconds()
    summary = tracker.summary()
    facts = JobFacts(
        mem=job.mem,
        state=state,
        reason=reason,
        runtime_s=runtime,
        peak_mem=summary["peak_mem"],
        util_mean=tracker.util_mean,
        util_min=tracker.util_min,
        util_max=tracker.util_max,
        util_stddev=tracker.util_stddev,
        util_samples=tracker.util_samples,
        card_bytes=card_bytes,
        retried_as=None if retry is None else retry.id,
        retry_mem=None if retry is None else retry.mem,
        retry_refused=retry_refused,
        oom_next_mem=oom_next_mem,
    )
    values = UsageMonitor.columns(tracker)
    values["peak_mem"] = summary["peak_mem"]
    values["hints"] = job_hints(facts, min_runtime_s)
    return values
