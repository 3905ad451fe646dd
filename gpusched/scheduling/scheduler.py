"""The scheduler core: one `tick()` (observe → admit → plan → start), and the job operations.

`Scheduler` reconciles the three owners of truth on every tick: the store (jobs),
the probe (GPUs) and the launcher (processes). It keeps no second copy of any of
them; what it caches (the last GPU reading, the last plan's waiting reasons) is
only for `status` and is rebuilt by the next tick.

Config, time, hardware and processes are injected (`config` holder, `clock`, `probe`,
`launcher`), so tests drive one tick at a time with a fixed clock and a launcher that
spawns nothing (tests/test_tick.py). Each phase of a tick reads and returns what it
found (modules observe, admission, policy); only the tick acts on it. How jobs end is
`JobEndings`' (module endings), and how a placed job starts is `JobStarter`'s (module
starting), both held here. One lock serialises ticks, endings and job operations.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpusched.core.clock import Clock, iso, utc_now
from gpusched.core.config import Config
from gpusched.core.config_holder import ConfigHolder
from gpusched.core.errors import ConflictError, UsageError
from gpusched.core.models import (
    TERMINAL_STATES,
    Drain,
    EndReason,
    GpuReport,
    GpuState,
    Job,
    JobState,
    NodeStatus,
    StopIntent,
    TimelinePoint,
)
from gpusched.core.units import format_size
from gpusched.gpus.probe import Probe
from gpusched.processes.launching import JobLauncher, Outcome, OutcomeKind
from gpusched.scheduling.admission import Admission, admit
from gpusched.scheduling.cluster import ClusterMember
from gpusched.scheduling.drain import load_drain, save_drain
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.fair_share import recent_usage
from gpusched.scheduling.gpu_reports import gpu_reports
from gpusched.scheduling.interactive import InteractiveJobs
from gpusched.scheduling.observe import Observation, observe, read_gpus
from gpusched.scheduling.policy import Placement, Plan, UserCap, plan
from gpusched.scheduling.policy_inputs import gpu_slot, running_claim, waiting_job
from gpusched.scheduling.starting import JobStarter
from gpusched.scheduling.submit_checks import check_fits
from gpusched.scheduling.waiting_ops import WaitingJobOperations
from gpusched.store import NewJob, Store
from gpusched.usage.joblog import append_note
from gpusched.usage.monitor import Overrun, UsageMonitor

log = logging.getLogger("gpusched.scheduler")

# Running jobs stopped per hold of the lock by cancel_many (each is a write and a signal).
CANCEL_CHUNK = 200


@dataclass
class _Reading:
    """The latest GPU reading and what the last plan said; for `status` only."""

    gpus: list[GpuState] = field(default_factory=list)
    usage: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> uuid -> bytes
    waiting_reasons: dict[int, str] = field(default_factory=dict)


class Scheduler:
    def __init__(
        self,
        config: ConfigHolder,
        store: Store,
        probe: Probe,
        launcher: JobLauncher,
        clock: Clock = utc_now,
    ) -> None:
        self.settings = config
        self.store = store
        self.probe = probe
        self.launcher = launcher
        self.clock = clock
        self._lock = threading.RLock()
        self._reading = _Reading()
        self.monitor = UsageMonitor(store)  # memory and utilization of running jobs
        self.drain: Drain | None = load_drain(self.config.state_dir)  # set by an administrator
        self.wake: Callable[[], None] = lambda: None  # set by the daemon
        self.cluster: ClusterMember | None = None  # set by the daemon in a cluster
        # Called with a job's id once it has ended, and whether it has notification hooks
        # to run. Called under the scheduler lock, so each must only hand the id over.
        self.end_listeners: list[Callable[[int, bool], None]] = []
        self.endings = JobEndings(
            config=config,
            store=store,
            probe=probe,
            launcher=launcher,
            monitor=self.monitor,
            clock=clock,
            lock=self._lock,
            gpus=self.current_gpus,
            wake=self._wake,
            end_listeners=self.end_listeners,
        )
        launcher.on_exit = self.endings.on_job_exit
        self.waiting = WaitingJobOperations(
            store=store,
            lock=self._lock,
            settings=config,
            clock=clock,
            endings=self.endings,
            wake=self._wake,
        )
        self.interactive = InteractiveJobs(
            config=config,
            store=store,
            monitor=self.monitor,
            endings=self.endings,
            clock=clock,
            lock=self._lock,
            wake=self._wake,
        )
        self.starter = JobStarter(
            config=config,
            store=store,
            probe=probe,
            launcher=launcher,
            monitor=self.monitor,
            endings=self.endings,
            clock=clock,
        )

    def _wake(self) -> None:
        self.wake()  # late-bound: the daemon sets `wake` after we are built

    @property
    def lock(self) -> threading.RLock:
        """The lock that serialises passes, endings and job operations."""
        return self._lock

    @property
    def config(self) -> Config:
        """The current config (read at each use, so a reload reaches the next tick)."""
        return self.settings.current

    # -- the tick -----------------------------------------------------------------------

    def tick(self) -> Plan:
        """One pass: observe → admit → plan → start. Never raises for one bad job."""
        with self._lock:
            self.endings.settle_unsettled()  # raises while the database is still away
            try:
                self.interactive.check_clients()  # before the plan counts their memory
            except Exception:  # one bad client must never stop scheduling
                log.exception("checking the interactive jobs' clients failed")
            seen = self.observe()
            try:
                self._act_on_overruns(seen.overruns)
                self.interactive.observe_idle(seen.running, seen.idle_evidence)
            except Exception:  # acting on what was measured must never stop scheduling
                log.exception("acting on the running jobs' usage failed")
            if self.cluster is not None:
                return self._cluster_tick(seen)
            admitted = self.admit()
            self.interactive.cap(admitted, seen.running)
            for doomed in admitted.doomed:
                self.endings.end(
                    doomed.job_id,
                    JobState.CANCELLED,
                    EndReason.DEPENDENCY_FAILED,
                    detail=doomed.detail,
                )
            result = self.plan(seen, admitted)
            self.start(result.placements, seen.gpus)
            self._reading = _Reading(
                seen.gpus, seen.usage, {**admitted.waiting_reasons, **result.waiting_reasons}
            )
        self.interactive.notify_placed()  # clients waiting for their placement look again
        return result

    def _cluster_tick(self, seen: Observation) -> Plan:
        """A pass as one daemon of a cluster (scheduling.cluster): agent, and scheduler
        when elected; placed jobs start through the same starter."""
        if self.cluster is None:
            raise RuntimeError("a cluster pass without a cluster")
        reports = gpu_reports(seen.gpus, seen.usage, seen.running, self.config.headroom_bytes)
        self._reading = _Reading(seen.gpus, seen.usage, self._reading.waiting_reasons)
        result = self.cluster.tick(seen, reports)
        if result is not None:
            self._reading.waiting_reasons = result.waiting_reasons
        return result or Plan([], {}, {})

    def read_gpus(self) -> list[GpuState]:
        return read_gpus(self.probe, self.config, self._reading.gpus)

    def observe(self) -> Observation:
        """The GPUs, the running jobs and what they hold; overruns found (not acted on)."""
        running = [j for j in self.store.running() if self.endings.owns(j)]
        return observe(
            self.probe,
            self.monitor,
            self.config,
            running=running,
            last=self._reading.gpus,
            now=self.clock(),
        )

    def admit(self) -> Admission:
        """The queued jobs free to be planned (dependencies), and those that never can be."""
        return admit(self.store.queued(), self.store.latest_attempts)

    def plan(self, seen: Observation, admitted: Admission) -> Plan:
        """The policy's placements and waiting reasons for this pass's reading."""
        eligible = admitted.eligible
        if self.drain is not None:  # an administrator's "start nothing new": no plan to make
            held_back = f"{self.drain.describe()}: no new job starts"
            return Plan([], {j.id: held_back for j in eligible}, {})
        users = {j.user for j in seen.running} | {j.user for j in eligible}
        config = self.config
        return plan(
            [gpu_slot(g, self.monitor.gpu_util(g.uuid)) for g in seen.gpus],
            [running_claim(j, seen.usage, self.monitor.job_util(j.id)) for j in seen.running],
            [waiting_job(j) for j in eligible],
            config.headroom_bytes,
            config.max_jobs_per_gpu,
            user_caps={user: self.cap(user) for user in users},
            user_usage=recent_usage(
                self.store, eligible, seen.gpus, self.clock(), config.fair_share_half_life_s
            ),
            busy_util=config.busy_util,
        )

    def start(self, placements: list[Placement], gpus: list[GpuState]) -> None:
        """Start each placed job on its GPUs (a job that cannot start is queued or ended)."""
        self.starter.start(placements, gpus)

    def cap(self, user: str) -> UserCap:
        limits = self.config.limits_for(user)
        return UserCap(limits.max_running, limits.max_mem_bytes)

    def _act_on_overruns(self, overruns: list[Overrun]) -> None:
        """Record each job over its declared memory; stop it with `overrun: kill`."""
        if not overruns:
            return
        now = iso(self.clock())
        kill = self.config.overrun == "kill"
        for overrun in overruns:
            job = overrun.job
            hint = overrun.hint()
            self.store.set_usage(job.id, overrun_at=now, hints=[hint] if hint else [])
            what = overrun.describe()
            action = ": stopping it (overrun: kill)" if kill else ": it puts its neighbours at risk"
            log.warning("%s%s", what, action)
            append_note(job.log_path, job.uid, what + action)
            if kill:
                self._stop(job, StopIntent.OVERRUN, what)

    def _stop(self, job: Job, intent: StopIntent, detail: str) -> None:
        """Ask a running job's supervisor to stop it, recording why first (read at its end).

        A job on another node (cluster) is stopped by that node's agent, which polls for
        the intent each pass."""
        if job.interactive:  # no supervisor: its client stops its command
            self.interactive.stop(job, intent, detail)
            return
        self.store.set_stop_intent(job.id, intent, detail)
        if self.endings.owns(job):
            self.stop_local(job)

    def stop_local(self, job: Job) -> None:
        """Ask this server's supervisor of a running job to stop it (its intent is set)."""
        start_time = self.store.launch_info(job.id).pid_start_time
        if job.pid is None or not self.launcher.cancel(job.pid, start_time):
            self.endings.settle(job.id, Outcome(OutcomeKind.CANCELLED))

    def adopt_running(self) -> None:
        """After a (re)start: a `running` row is a claim to verify, not a fact."""
        self.endings.adopt_running()

    # -- operations requested by clients ------------------------------------------------------

    def submit(self, new: NewJob) -> Job:
        return self.submit_many([new], as_array=False)[0]

    def submit_many(self, news: list[NewJob], as_array: bool) -> list[Job]:
        """Check and queue jobs in one transaction (an array shares one array id)."""
        new = news[0]  # the jobs of one submit differ only in their command
        if self.cluster is not None:
            check_fits(new, self.cluster.gpus_by_node(), self.config.headroom_bytes)
        else:
            check_fits(new, {self.node_name: self.current_gpus()}, self.config.headroom_bytes)
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

    def current_gpus(self) -> list[GpuState]:
        return self._reading.gpus or self.read_gpus()

    def cancel(self, job: Job, by: str, waiting_only: bool = False) -> Job:
        """`waiting_only`: refuse (ConflictError) if it has started, checked under the lock."""
        with self._lock:
            self._cancel_locked(job, by, waiting_only)
            self.wake()
            return self.store.get(job.id)

    def cancel_many(self, jobs: list[Job], by: str, waiting_only: bool = False) -> list[int]:
        """Cancel jobs (running ones, of `cancel --all` or of an array) a chunk per hold of
        the lock and with one wake-up: cancelling 1,000 running jobs one request each ran
        a scheduling pass between every two and took ten minutes. Returns the ids
        cancelled (a job that ended, or with `waiting_only` started, meanwhile is not)."""
        cancelled: list[int] = []
        for first in range(0, len(jobs), CANCEL_CHUNK):
            with self._lock:  # released between chunks: others' requests go on
                for job in jobs[first : first + CANCEL_CHUNK]:
                    try:
                        self._cancel_locked(job, by, waiting_only)
                    except ConflictError:
                        continue
                    cancelled.append(job.id)
        if cancelled:
            self.wake()
        return cancelled

    def _cancel_locked(self, job: Job, by: str, waiting_only: bool) -> None:
        job = self.store.get(job.id)
        if job.state in TERMINAL_STATES:
            raise ConflictError(f"job {job.id} has already ended ({job.state})")
        if waiting_only and job.state == JobState.RUNNING:
            raise ConflictError(f"job {job.id} has started")
        if job.state == JobState.RUNNING:
            self._stop(job, StopIntent.CANCEL, f"cancelled by {by}")
        else:
            self.endings.end(
                job.id, JobState.CANCELLED, EndReason.CANCELLED, detail=f"cancelled by {by}"
            )

    @property
    def node_name(self) -> str:
        return self.starter.node or ""

    def set_drain(self, drain: Drain | None) -> None:
        """Start nothing new (a Drain), or start again (None); kept across restarts. In a
        cluster, the node's row says so too: the scheduler places nothing on it."""
        with self._lock:
            save_drain(self.config.state_dir, drain)
            self.drain = drain
            if self.cluster is not None:
                self.cluster.drain_node(self.node_name, drain)
        if drain is None:
            log.info("drain lifted: jobs start again")
        else:
            log.warning("%s: no new job starts until `gpusched undrain`", drain.describe())
        self.wake()

    # -- views ------------------------------------------------------------------------------

    def decorate(self, job: Job) -> Job:
        """Add what is known only in memory: why a queued job waits."""
        if job.state == JobState.HELD:
            job.waiting_reason = "held: release it with `gpusched release`"
        elif job.state == JobState.QUEUED:
            # In a cluster the elected scheduler's reason is in the row (job.waiting_reason).
            job.waiting_reason = (
                self._reading.waiting_reasons.get(job.id)
                or job.waiting_reason
                or "waiting for the next scheduling pass"
            )
        elif job.state == JobState.RUNNING:
            job.warning = self.interactive.warnings.get(job.id)
            tracker = self.monitor.live(job.id)
            if tracker is not None:  # figures so far, from memory (written at the end)
                summary = tracker.summary()
                job.peak_mem = max(job.peak_mem or 0, summary.pop("peak_mem") or 0) or None
                for key, value in summary.items():
                    setattr(job, key, value)
        return job

    def job_timeline(self, job: Job) -> list[TimelinePoint]:
        """A job's memory and utilization over time, oldest first: for a running job, what
        this daemon holds in memory (the store lags it by up to a usage flush)."""
        if job.state == JobState.RUNNING:
            live = self.monitor.live_timeline(job.id)
            if live:
                return live
        return self.store.job_timeline(job.id)

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        """This server's GPUs; in a cluster, every node's that is not down."""
        if self.cluster is not None:
            return [g for node in self.nodes() for g in node.gpus if node.state != "down"]
        reading = self._reading
        mine = [j for j in running if self.endings.owns(j)]
        reports = gpu_reports(reading.gpus, reading.usage, mine, self.config.headroom_bytes)
        return [dataclasses.replace(r, node=self.starter.node) for r in reports]

    def nodes(self) -> list[NodeStatus]:
        """Every node, as `status` shows it: this server alone when it is not in a cluster."""
        if self.cluster is not None:
            return self.cluster.nodes_status()
        state = "drained" if self.drain is not None else "up"
        return [NodeStatus(self.node_name, state, 0.0, self.gpu_reports([]))]
