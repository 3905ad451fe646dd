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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import psutil

from gpusched.config import Config
from gpusched.errors import ConflictError, GpuError, NotFoundError, UsageError
from gpusched.gpus import Probe, apply_selection
from gpusched.launcher import (
    Launcher,
    Outcome,
    StartError,
    find_supervisor,
    is_same_process,
    job_environment,
    process_start_time,
)
from gpusched.models import (
    TERMINAL_STATES,
    EndReason,
    GpuHealth,
    GpuReport,
    GpuState,
    Job,
    JobState,
)
from gpusched.policy import (
    GpuSlot,
    Plan,
    RunningClaim,
    UserCap,
    WaitingJob,
    gpu_budgets,
    plan,
)
from gpusched.store import NewJob, Store
from gpusched.units import format_size

log = logging.getLogger("gpusched.scheduler")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


@dataclass
class _Reading:
    """The latest GPU reading and what the last plan said; for `status` only."""

    gpus: list[GpuState] = field(default_factory=list)
    usage: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> uuid -> bytes
    waiting_reasons: dict[int, str] = field(default_factory=dict)


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"] or 0, []).append(process.pid)
    return children


def _tree(root: int, children: dict[int, list[int]]) -> set[int]:
    seen = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def attribute_usage(gpus: Iterable[GpuState], running: Iterable[Job]) -> dict[int, dict[str, int]]:
    """GPU memory per running job and GPU: the processes of each job's whole tree.

    One scan of the process table per tick, not one per job.
    """
    gpus = list(gpus)
    usage: dict[int, dict[str, int]] = {}
    if not any(gpu.processes for gpu in gpus):
        return usage
    children = _children_map()
    for job in running:
        if job.pid is None:
            continue
        tree = _tree(job.pid, children)
        for gpu in gpus:
            held = sum(p.used_bytes or 0 for p in gpu.processes if p.pid in tree)
            if held:
                usage.setdefault(job.id, {})[gpu.uuid] = held
    return usage


class Scheduler:
    def __init__(
        self,
        config: Config,
        store: Store,
        probe: Probe,
        launcher_factory: Callable[[Callable[[int], None]], Launcher],
        clock: Clock = utc_now,
    ) -> None:
        self.config = config
        self.store = store
        self.probe = probe
        self.clock = clock
        self.launcher = launcher_factory(self._on_job_exit)
        self._lock = threading.RLock()
        self._ended = threading.Condition()
        self._reading = _Reading()
        self._peaks: dict[int, int] = {}
        self.wake: Callable[[], None] = lambda: None  # set by the daemon

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
            active = self.store.active()
            running = [j for j in active if j.state == JobState.RUNNING]
            usage = attribute_usage(gpus, running)
            self._record_peaks(usage)
            eligible, reasons = self._eligible([j for j in active if j.state == JobState.QUEUED])
            users = {j.user for j in active}
            result = plan(
                [_slot(g) for g in gpus],
                [_claim(j, usage) for j in running],
                [WaitingJob(j.id, j.mem, j.gpus, j.priority, j.user) for j in eligible],
                self.config.headroom_bytes,
                self.config.max_jobs_per_gpu,
                user_caps={user: self._cap(user) for user in users},
            )
            by_uuid = {g.uuid: g for g in gpus}
            for placement in result.placements:
                self._launch(placement.job_id, [by_uuid[u] for u in placement.gpu_uuids])
            reasons.update(result.waiting_reasons)
            self._reading = _Reading(gpus, usage, reasons)
            return result

    def _cap(self, user: str) -> UserCap:
        limits = self.config.limits_for(user)
        return UserCap(limits.max_running, limits.max_mem_bytes)

    def _eligible(self, queued: list[Job]) -> tuple[list[Job], dict[int, str]]:
        """Queued jobs whose dependencies succeeded; end those whose dependencies cannot."""
        reasons: dict[int, str] = {}
        needed = {dep for job in queued for dep in job.after}
        deps = self.store.get_many(needed) if needed else {}
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

    def _launch(self, job_id: int, gpus: list[GpuState]) -> None:
        job = self.store.get(job_id)
        info = self.store.launch_info(job_id)
        indices = [g.index for g in gpus]
        uuids = [g.uuid for g in gpus]
        env = job_environment(job, info.env, indices, uuids, self.config.visible_devices)
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
        try:
            started = self.launcher.start(job, env, info.umask, info.gid)
        except StartError as exc:
            log.warning("job %s failed to start: %s", job_id, exc)
            self._end(job_id, JobState.FAILED, EndReason.FAILED_TO_START, detail=str(exc))
            return
        self.store.set_pid(job_id, started.pid, started.start_time)
        self.probe.note_job_started(started.pid, uuids, job.mem)
        log.info(
            "job %s started on GPU %s (pid %s): %s",
            job_id,
            ",".join(map(str, indices)),
            started.pid,
            " ".join(job.command),
        )

    def _record_peaks(self, usage: dict[int, dict[str, int]]) -> None:
        for job_id, per_gpu in usage.items():
            peak = max(per_gpu.values())
            if peak > self._peaks.get(job_id, 0):
                self._peaks[job_id] = peak
                self.store.record_usage(job_id, peak)

    # -- job ends -------------------------------------------------------------------------

    def _end(
        self,
        job_id: int,
        state: JobState,
        reason: EndReason,
        *,
        exit_code: int | None = None,
        detail: str | None = None,
    ) -> bool:
        ended = self.store.mark_ended(
            job_id,
            state=state,
            reason=str(reason),
            now=iso(self.clock()),
            exit_code=exit_code,
            detail=detail,
        )
        self._peaks.pop(job_id, None)
        if ended:
            log.info("job %s %s (%s)%s", job_id, state, reason, f": {detail}" if detail else "")
            with self._ended:
                self._ended.notify_all()
        return ended

    def _on_job_exit(self, job_id: int) -> None:
        """Called by the launcher's watcher thread when a job's supervisor exits."""
        with self._lock:
            self._settle(job_id, self.launcher.outcome(job_id))
        self.wake()

    def _settle(self, job_id: int, outcome: Outcome) -> None:
        job = self.store.get(job_id)
        if job.state != JobState.RUNNING:
            return
        if (
            outcome.kind == "lost"
            and job.reason_detail
            and job.reason_detail.startswith("cancelled")
        ):
            # A cancel that reached the supervisor before it set up its SIGTERM handler
            # killed it outright; it sets the handler before starting the job, so the job
            # never started: the cancel simply won.
            outcome = Outcome("cancelled")
        if outcome.kind == "exit":
            state = JobState.DONE if outcome.exit_code == 0 else JobState.FAILED
            self._end(job_id, state, EndReason.EXIT, exit_code=outcome.exit_code)
        elif outcome.kind == "signal":
            self._end(
                job_id,
                JobState.FAILED,
                EndReason.SIGNAL,
                exit_code=outcome.exit_code,
                detail=outcome.message,
            )
        elif outcome.kind == "cancelled":
            self._end(
                job_id,
                JobState.CANCELLED,
                EndReason.CANCELLED,
                exit_code=outcome.exit_code,
                detail=job.reason_detail or "cancelled",
            )
        elif outcome.kind == "failed_to_start":
            self._end(job_id, JobState.FAILED, EndReason.FAILED_TO_START, detail=outcome.message)
        else:
            self._end(job_id, JobState.LOST, EndReason.LOST, detail=outcome.message)

    def adopt_running(self) -> None:
        """After a (re)start: a `running` row is a claim to verify, not a fact."""
        with self._lock:
            for job in self.store.active():
                if job.state != JobState.RUNNING:
                    continue
                pid, start_time = job.pid, self.store.launch_info(job.id).pid_start_time
                if pid is None:
                    # The previous daemon died between marking and recording the pid.
                    pid = find_supervisor(self.launcher.job_dir(job.id) / "spec.json")
                    start_time = process_start_time(pid) if pid is not None else None
                    if pid is not None and start_time is not None:
                        self.store.set_pid(job.id, pid, start_time)
                if pid is not None and is_same_process(pid, start_time):
                    log.info("job %s still running (pid %s): re-adopted", job.id, pid)
                    self.launcher.watch(job.id, pid)
                    self.probe.note_job_started(pid, job.gpu_uuids, job.mem)
                else:
                    outcome = self.launcher.outcome(job.id)
                    if outcome.kind == "lost":
                        outcome = Outcome(
                            "lost",
                            message="its supervisor was gone when the daemon"
                            " restarted, with no exit status recorded",
                        )
                    self._settle(job.id, outcome)

    # -- operations requested by clients ------------------------------------------------------

    def submit(self, new: NewJob) -> Job:
        gpus = [g for g in self._current_gpus() if g.health != GpuHealth.EXCLUDED]
        if not gpus:
            raise ConflictError("this daemon has no GPUs to run jobs on")
        if new.gpus > len(gpus):
            raise UsageError(f"--gpus {new.gpus}: this server has only {len(gpus)} GPU(s)")
        if new.mem is not None:
            largest = max(gpus, key=lambda g: (g.total_bytes, -g.index))
            if new.mem > largest.total_bytes - self.config.headroom_bytes:
                raise UsageError(
                    f"--mem {format_size(new.mem)} is more than any GPU can give: the largest is"
                    f" GPU {largest.index} ({largest.name}) with {format_size(largest.total_bytes)}"
                    f" total, {format_size(largest.total_bytes - self.config.headroom_bytes)}"
                    " after headroom"
                )
        max_queued = self.config.limits_for(new.user).max_queued
        if max_queued is not None:
            waiting = sum(1 for j in self.store.active() if j.uid == new.uid and j.state.is_waiting)
            if waiting >= max_queued:
                raise ConflictError(
                    f"user limit: {new.user} already has {waiting} waiting jobs"
                    f" (max_queued {max_queued}); cancel some or wait for them to start"
                )
        for dep in new.after:
            try:
                self.store.get(dep)
            except NotFoundError:
                raise UsageError(f"--after {dep}: no job {dep}") from None
        job = self.store.add(new, iso(self.clock()))
        log.info(
            "job %s submitted by %s: mem %s x %s GPU(s)",
            job.id,
            job.user,
            format_size(job.mem) if job.mem else "whole",
            job.gpus,
        )
        self.wake()
        return job

    def _current_gpus(self) -> list[GpuState]:
        return self._reading.gpus or self.read_gpus()

    def cancel(self, job: Job, by: str) -> Job:
        with self._lock:
            job = self.store.get(job.id)
            if job.state in TERMINAL_STATES:
                raise ConflictError(f"job {job.id} has already ended ({job.state})")
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
        with self._ended:
            self._ended.wait_for(
                lambda: all(
                    j.state in TERMINAL_STATES for j in self.store.get_many(job_ids).values()
                ),
                timeout=max(0.0, timeout_s),
            )
        found = self.store.get_many(job_ids)
        return [found[i] for i in job_ids if i in found]

    # -- views ------------------------------------------------------------------------------

    def decorate(self, job: Job) -> Job:
        """Add what is known only in memory: why a queued job waits."""
        if job.state == JobState.HELD:
            job.waiting_reason = "held: release it with `gpusched release`"
        elif job.state == JobState.QUEUED:
            job.waiting_reason = self._reading.waiting_reasons.get(
                job.id, "waiting for the next scheduling pass"
            )
        return job

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        reading = self._reading
        claims = [_claim(j, reading.usage) for j in running]
        budgets = gpu_budgets([_slot(g) for g in reading.gpus], claims, self.config.headroom_bytes)
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


def _slot(gpu: GpuState) -> GpuSlot:
    return GpuSlot(
        gpu.uuid, gpu.index, gpu.total_bytes, gpu.free_bytes, usable=gpu.health == GpuHealth.OK
    )


def _claim(job: Job, usage: dict[int, dict[str, int]]) -> RunningClaim:
    return RunningClaim(job.id, tuple(job.gpu_uuids), job.mem, usage.get(job.id, {}), job.user)
