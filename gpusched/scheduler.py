"""The scheduler core: reconcile, plan and launch (one `tick()`), and the job operations.

`Scheduler` reconciles the three owners of truth on every tick: the store (jobs),
the probe (GPUs) and the launcher (processes). It keeps no second copy of any of
them; what it caches (the last GPU reading, the last plan's waiting reasons) is
only for `status` and is rebuilt by the next tick.

Time, hardware and processes are injected (`clock`, `probe`, `launcher`) so tests
can drive one tick at a time. One lock serialises ticks and job operations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from gpusched.attribution import attribute_processes, held_bytes
from gpusched.clock import Clock, iso, utc_now
from gpusched.config import Config
from gpusched.drain import load_drain, save_drain
from gpusched.endings import JobEndings
from gpusched.errors import ConflictError, GpuError, UsageError
from gpusched.gpus import Probe, apply_selection
from gpusched.joblog import append_note
from gpusched.launcher import (
    Launcher,
    Outcome,
    StartError,
    job_environment,
)
from gpusched.models import (
    TERMINAL_STATES,
    Drain,
    EndReason,
    GpuHealth,
    GpuProcess,
    GpuReport,
    GpuState,
    Job,
    JobState,
)
from gpusched.monitor import UsageMonitor
from gpusched.policy import (
    Plan,
    UsageSpan,
    UserCap,
    WaitingJob,
    decayed_usage,
    gpu_budgets,
    plan,
)
from gpusched.policy_inputs import capacity_bytes, epoch_seconds, gpu_slot, running_claim
from gpusched.store import NewJob, Queued, Store
from gpusched.units import format_size

log = logging.getLogger("gpusched.scheduler")


@dataclass
class _Reading:
    """The latest GPU reading and what the last plan said; for `status` only."""

    gpus: list[GpuState] = field(default_factory=list)
    usage: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> uuid -> bytes
    waiting_reasons: dict[int, str] = field(default_factory=dict)


class Scheduler(JobEndings):
    def __init__(
        self,
        config: Config,
        store: Store,
        probe: Probe,
        clock: Clock = utc_now,
    ) -> None:
        self.config = config
        self.store = store
        self.probe = probe
        self.clock = clock
        self.launcher = Launcher(
            config.state_dir, config.log_dir, config.kill_grace_s, self._on_job_exit
        )
        self._lock = threading.RLock()
        self._ended = threading.Condition()
        # Ids of the latest ended jobs and how many ended in all (under `_ended`): a
        # waiter re-reads the database only when one of its own jobs may have ended.
        self._recent_ends: deque[int] = deque(maxlen=1024)
        self._end_count = 0
        self._reading = _Reading()
        self.monitor = UsageMonitor(store)  # memory and utilization of running jobs
        self.drain: Drain | None = load_drain(config.state_dir)  # set by an administrator
        self.wake: Callable[[], None] = lambda: None  # set by the daemon
        # Called with a job's id once it has ended, and whether it has notification hooks
        # to run. Called under the scheduler lock, so each must only hand the id over.
        self.end_listeners: list[Callable[[int, bool], None]] = []

    # -- the tick -----------------------------------------------------------------------

    def read_gpus(self) -> list[GpuState]:
        try:
            gpus = self.probe.snapshot()
        except GpuError as exc:
            # Hardware that read fine at start-up and now fails: show every card lost,
            # start nothing, keep the daemon alive; the next tick tries again.
            log.error("cannot read GPUs: %s", exc.message)
            gpus = [
                GpuState(
                    g.index,
                    g.uuid,
                    g.name,
                    g.total_bytes,
                    0,
                    0,
                    None,
                    GpuHealth.LOST,
                    (),
                    exc.message,
                )
                for g in self._reading.gpus
            ]
        return apply_selection(gpus, self.config.gpus)

    def tick(self) -> Plan:
        """One pass: read GPUs, settle dependencies, plan, launch. Never raises for one bad job."""
        with self._lock:
            gpus = self.read_gpus()
            running = self.store.running()
            processes = attribute_processes(gpus, running)
            usage = held_bytes(processes)
            self.monitor.observe_gpus(gpus)
            try:
                self._watch(gpus, running, processes)
            except Exception:  # measuring must never stop scheduling
                log.exception("watching the running jobs' usage failed")
            eligible, reasons = self._eligible(self.store.queued())
            if self.drain is None:
                result = self._plan(gpus, running, usage, eligible)
            else:  # an administrator's "start nothing new": no plan to make
                held_back = f"{self.drain.describe()}: no new job starts"
                result = Plan([], {j.id: held_back for j in eligible}, {})
            by_uuid = {g.uuid: g for g in gpus}
            for placement in result.placements:
                gpus_of = [by_uuid[u] for u in placement.gpu_uuids]
                self._launch(self.store.get(placement.job_id), gpus_of)
            reasons.update(result.waiting_reasons)
            self._reading = _Reading(gpus, usage, reasons)
            return result

    def _plan(
        self,
        gpus: list[GpuState],
        running: list[Job],
        usage: dict[int, dict[str, int]],
        eligible: list[Queued],
    ) -> Plan:
        """The policy's placements and waiting reasons for this pass's reading."""
        users = {j.user for j in running} | {j.user for j in eligible}
        return plan(
            [gpu_slot(g, self.monitor.gpu_util(g.uuid)) for g in gpus],
            [running_claim(j, usage, self.monitor.job_util(j.id)) for j in running],
            [
                WaitingJob(
                    j.id,
                    j.mem,
                    j.gpus,
                    j.priority,
                    j.user,
                    j.array_id,
                    j.max_concurrent,
                    queue_order=j.retry_of,  # an OOM retry keeps its first attempt's place
                )
                for j in eligible
            ],
            self.config.headroom_bytes,
            self.config.max_jobs_per_gpu,
            user_caps={user: self._cap(user) for user in users},
            user_usage=self._fair_share(eligible, gpus),
            busy_util=self.config.busy_util,
        )

    def _fair_share(self, waiting: list[Queued], gpus: list[GpuState]) -> dict[str, float]:
        """Recent decayed GPU memory-time per user; only needed when users compete."""
        if len({j.user for j in waiting}) < 2:
            return {}
        now = self.clock()
        half_life = self.config.fair_share_half_life_s
        # Past ten half-lives a job weighs under 0.1 % of what it did: leave it out.
        since = iso(now - timedelta(seconds=10 * half_life))
        totals = {g.uuid: g.total_bytes for g in gpus}
        spans = [
            UsageSpan(
                job.user,
                sum(job.mem if job.mem is not None else totals.get(u, 0) for u in job.gpu_uuids),
                epoch_seconds(job.started_at),
                None if job.ended_at is None else epoch_seconds(job.ended_at),
            )
            for job in self.store.usage_since(since)
            if job.started_at is not None
        ]
        return decayed_usage(spans, now.timestamp(), half_life)

    def _cap(self, user: str) -> UserCap:
        limits = self.config.limits_for(user)
        return UserCap(limits.max_running, limits.max_mem_bytes)

    def _eligible(self, queued: list[Queued]) -> tuple[list[Queued], dict[int, str]]:
        """Queued jobs whose dependencies succeeded; end those whose dependencies cannot."""
        reasons: dict[int, str] = {}
        needed = {dep for job in queued for dep in job.after}
        # A dependency that ran out of memory and was retried is its retry.
        deps = self.store.latest_attempts(needed) if needed else {}
        eligible = []
        for job in queued:
            failed = [
                d
                for d in job.after
                if d in deps and deps[d].state in TERMINAL_STATES and deps[d].state != JobState.DONE
            ]
            pending = [d for d in job.after if d in deps and deps[d].state not in TERMINAL_STATES]
            if failed:
                dep = deps[failed[0]]
                self._end(
                    job.id,
                    JobState.CANCELLED,
                    EndReason.DEPENDENCY_FAILED,
                    detail=f"job {dep.id} ended {dep.state} ({dep.reason})",
                )
            elif pending:
                reasons[job.id] = "waiting for job " + ", ".join(map(str, pending))
            else:
                eligible.append(job)
        return eligible, reasons

    def _launch(self, job: Job, gpus: list[GpuState]) -> None:
        """Start a queued job on `gpus`."""
        job_id = job.id
        info = self.store.launch_info(job_id)
        indices = [g.index for g in gpus]
        uuids = [g.uuid for g in gpus]
        env = job_environment(
            job,
            info.env,
            indices,
            uuids,
            self.config.visible_devices,
            gpu_totals=[g.total_bytes for g in gpus],
        )
        # Mark running *before* starting: if the daemon dies in between, a restart finds
        # a running row with no pid and looks for its supervisor, so nothing starts twice.
        log_path = str(self.launcher.log_path(job_id))
        if not self.store.mark_running(
            job_id,
            gpu_indices=indices,
            gpu_uuids=uuids,
            pid=None,
            pid_start_time=None,
            log_path=log_path,
            now=iso(self.clock()),
        ):
            return
        self.monitor.started(job_id)  # before: its end (even a failed start) forgets it
        try:
            started = self.launcher.start(job, env, info.umask, info.gid)
        except StartError as exc:
            log.warning("job %s failed to start: %s", job_id, exc)
            self._end(job_id, JobState.FAILED, EndReason.FAILED_TO_START, detail=str(exc))
            return
        self.store.set_pid(job_id, started.pid, started.start_time)
        self.probe.note_job_started(started.pid, uuids, job.mem)
        log.info(
            "job %s started on GPU %s (pid %s, via %s): %s",
            job_id,
            ",".join(map(str, indices)),
            started.pid,
            started.via,
            " ".join(job.command),
        )

    def _watch(
        self,
        gpus: list[GpuState],
        running: list[Job],
        processes: dict[int, dict[str, list[GpuProcess]]],
    ) -> None:
        """Feed the usage monitor; act on jobs over their declared memory (`overrun`)."""
        if not processes:
            return
        process_util = None
        sample = getattr(self.probe, "process_utilization", None)  # NVML only
        if sample is not None:
            try:
                process_util = sample()
            except GpuError as exc:
                log.warning("cannot sample per-process utilization: %s", exc.message)
        now = self.clock()
        overruns = self.monitor.observe(
            now_s=now.timestamp(),
            now_iso=iso(now),
            gpus=gpus,
            running=running,
            processes=processes,
            process_util=process_util,
            margin_fraction=self.config.overrun_margin_fraction,
            margin_bytes=self.config.overrun_margin_bytes,
        )
        for overrun in overruns:
            job, kill = overrun.job, self.config.overrun == "kill"
            hint = overrun.hint()
            self.store.set_usage(job.id, overrun_at=iso(now), hints=[hint] if hint else [])
            what = overrun.describe()
            action = ": stopping it (overrun: kill)" if kill else ": it puts its neighbours at risk"
            log.warning("%s%s", what, action)
            append_note(job.log_path, job.uid, what + action)
            if kill:
                self.store.set_detail(job.id, "overrun: " + what)
                start_time = self.store.launch_info(job.id).pid_start_time
                if job.pid is None or not self.launcher.cancel(job.pid, start_time):
                    self._settle(job.id, Outcome("cancelled"))

    # -- operations requested by clients ------------------------------------------------------

    def submit(self, new: NewJob) -> Job:
        return self.submit_many([new], as_array=False)[0]

    def submit_many(self, news: list[NewJob], as_array: bool) -> list[Job]:
        """Check and queue jobs in one transaction (an array shares one array id)."""
        new = news[0]  # the jobs of one submit differ only in their command
        gpus = [g for g in self._current_gpus() if g.health != GpuHealth.EXCLUDED]
        if not gpus:
            raise ConflictError("this daemon has no GPUs to run jobs on")
        if new.gpus > len(gpus):
            raise UsageError(f"--gpus {new.gpus}: this server has only {len(gpus)} GPU(s)")
        if new.mem is not None:
            largest = max(gpus, key=lambda g: (capacity_bytes(g), -g.index))
            most = capacity_bytes(largest) - self.config.headroom_bytes
            if new.mem > most:
                raise UsageError(
                    f"--mem {format_size(new.mem)} is more than any GPU can give: the largest is"
                    f" GPU {largest.index} ({largest.name}) with {format_size(largest.total_bytes)}"
                    f" total, {format_size(most)} usable by jobs"
                )
        found = self.store.get_many(new.after)
        for dep in new.after:
            if dep not in found:
                raise UsageError(f"--after {dep}: no job {dep}")
        # `max_queued` is counted and applied in the insert's own transaction (Store).
        max_queued = self.config.limits_for(new.user).max_queued
        jobs = self.store.add_many(
            news, iso(self.clock()), as_array=as_array, max_waiting=max_queued
        )
        log.info(
            "job %s submitted by %s: mem %s x %s GPU(s)%s",
            ",".join(str(j.id) for j in jobs) if len(jobs) < 5 else f"{jobs[0].id}-{jobs[-1].id}",
            new.user,
            format_size(new.mem) if new.mem else "whole",
            new.gpus,
            f", array a{jobs[0].array_id}" if as_array else "",
        )
        self.wake()
        return jobs

    def _current_gpus(self) -> list[GpuState]:
        return self._reading.gpus or self.read_gpus()

    def cancel(self, job: Job, by: str, waiting_only: bool = False) -> Job:
        """`waiting_only`: refuse (ConflictError) if it has started, checked under the lock."""
        with self._lock:
            job = self.store.get(job.id)
            if job.state in TERMINAL_STATES:
                raise ConflictError(f"job {job.id} has already ended ({job.state})")
            if waiting_only and job.state == JobState.RUNNING:
                raise ConflictError(f"job {job.id} has started")
            if job.state == JobState.RUNNING:
                self.store.set_detail(job.id, f"cancelled by {by}")
                info = self.store.launch_info(job.id)
                if job.pid is None or not self.launcher.cancel(job.pid, info.pid_start_time):
                    self._settle(job.id, Outcome("cancelled"))
            else:
                self._end(
                    job.id, JobState.CANCELLED, EndReason.CANCELLED, detail=f"cancelled by {by}"
                )
            self.wake()
            return self.store.get(job.id)

    def cancel_waiting(self, uid: int, by: str, array_id: int | None = None) -> list[int]:
        """Cancel all of a user's waiting jobs (of one array) at once: their ids.

        One transaction for any number (job by job, 100,000 took minutes); their ends
        are announced as `_end` announces one.
        """
        with self._lock:
            ended = self.store.cancel_waiting(
                uid, array_id, f"cancelled by {by}", iso(self.clock()), bool(self.config.on_finish)
            )
            self._announce_ends(ended)
        if ended:
            log.info("%d waiting jobs of uid %d cancelled by %s", len(ended), uid, by)
            self.wake()
        return [job_id for job_id, _ in ended]

    def set_drain(self, drain: Drain | None) -> None:
        """Start nothing new (a Drain), or start again (None); kept across restarts."""
        with self._lock:
            save_drain(self.config.state_dir, drain)
            self.drain = drain
        if drain is None:
            log.info("drain lifted: jobs start again")
        else:
            log.warning("%s: no new job starts until `gpusched undrain`", drain.describe())
        self.wake()

    def set_priority(self, job: Job, priority: int) -> Job:
        with self._lock:
            if not self.store.set_priority(job.id, priority):
                current = self.store.get(job.id)
                raise ConflictError(
                    f"job {job.id} is {current.state}: only a waiting job's priority can change"
                )
        self.wake()
        return self.store.get(job.id)

    def hold(self, job: Job) -> Job:
        with self._lock:
            if not self.store.hold(job.id):
                current = self.store.get(job.id)
                if current.state != JobState.HELD:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a queued job can be held"
                    )
            return self.store.get(job.id)

    def release(self, job: Job) -> Job:
        with self._lock:
            if not self.store.release(job.id):
                current = self.store.get(job.id)
                if current.state != JobState.QUEUED:
                    raise ConflictError(
                        f"job {job.id} is {current.state}: only a held job can be released"
                    )
        self.wake()
        return self.store.get(job.id)

    def wait_ended(self, job_ids: list[int], timeout_s: float) -> list[Job]:
        """Block until every job has ended or the timeout passes; return their current rows."""
        self.wait_until_ended(job_ids, timeout_s)
        found = self.store.get_many(job_ids)
        return [found[i] for i in job_ids if i in found]

    def wait_until_ended(self, job_ids: list[int], timeout_s: float) -> None:
        """Block until every job has ended or the timeout passes (reads their states only)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._ended:
            # Every ending goes through _end, which records it under this condition after
            # its commit: an end is either seen by this read or recorded while we wait.
            seen = self._end_count
            states = self.store.states_of(job_ids).items()
            pending = {i for i, state in states if state not in TERMINAL_STATES}
            while pending and (remaining := deadline - time.monotonic()) > 0:
                self._ended.wait(remaining)
                new = self._end_count - seen
                seen = self._end_count
                if new > len(self._recent_ends):  # more ended than remembered: read again
                    again = self.store.states_of(pending).items()
                    pending = {i for i, state in again if state not in TERMINAL_STATES}
                elif new:
                    pending.difference_update(list(self._recent_ends)[-new:])

    # -- views ------------------------------------------------------------------------------

    def decorate(self, job: Job) -> Job:
        """Add what is known only in memory: why a queued job waits."""
        if job.state == JobState.HELD:
            job.waiting_reason = "held: release it with `gpusched release`"
        elif job.state == JobState.QUEUED:
            job.waiting_reason = self._reading.waiting_reasons.get(
                job.id, "waiting for the next scheduling pass"
            )
        elif job.state == JobState.RUNNING:
            tracker = self.monitor.live(job.id)
            if tracker is not None:  # figures so far, from memory (written at the end)
                summary = tracker.summary()
                job.peak_mem = max(job.peak_mem or 0, summary.pop("peak_mem") or 0) or None
                for key, value in summary.items():
                    setattr(job, key, value)
        return job

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        reading = self._reading
        claims = [running_claim(j, reading.usage) for j in running]
        budgets = gpu_budgets(
            [gpu_slot(g) for g in reading.gpus], claims, self.config.headroom_bytes
        )
        reports = []
        for gpu in reading.gpus:
            budget = budgets[gpu.uuid]
            by_jobs = sum(u.get(gpu.uuid, 0) for u in reading.usage.values())
            used = gpu.used_bytes
            reports.append(
                GpuReport(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    name=gpu.name,
                    total=gpu.total_bytes,
                    used=used,
                    free=gpu.free_bytes,
                    reserved=budget.reserved_bytes,
                    available=budget.available_bytes,
                    used_by_jobs=by_jobs,
                    used_by_others=max(0, used - by_jobs),
                    util=gpu.util_percent,
                    state=str(gpu.health),
                    jobs=[j.id for j in running if gpu.uuid in j.gpu_uuids],
                    error=gpu.error,
                )
            )
        return reports
