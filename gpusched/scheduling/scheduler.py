"""The scheduler: one pass (`tick()`, the named phases of scheduling.phases) and the job
operations clients ask for.

`Scheduler` reconciles the three owners of truth on every pass: the store (jobs), the
probe (GPUs) and the launcher (processes). It keeps no second copy of any of them; what
it caches (the last GPU reading, the last plan's waiting reasons) is only for `status`
and is rebuilt by the next pass.

Everything is built once, at construction, on one `Context` (scheduling.context: config
holder, store, probe, launcher, monitor, clock, lock, wake, end listeners) and one
ownership strategy (scheduling.ownership: `LocalNode`, or the cluster's `ClusterNode`):
the endings, the starter, the interactive jobs, the waiting jobs' operations and the
placer (scheduling.placers: `LocalPlacer`, or the cluster's `ClusterAgent`) each get
what they need then; nothing is assigned onto them afterwards. Tests drive one pass at a
time with a fixed clock and a launcher that spawns nothing (tests/world.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from gpusched.core.clock import iso
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
from gpusched.processes.pidref import is_same_process
from gpusched.scheduling.adoption import adopt
from gpusched.scheduling.cluster.agent import ClusterAgent
from gpusched.scheduling.cluster.node import ClusterNode
from gpusched.scheduling.context import Context
from gpusched.scheduling.drain import DrainSwitch
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.expected_start import expected_start
from gpusched.scheduling.interactive import InteractiveJobs
from gpusched.scheduling.ownership import LocalNode
from gpusched.scheduling.phases import Parts, run_pass
from gpusched.scheduling.placers import LocalPlacer, Placer
from gpusched.scheduling.policy import Plan
from gpusched.scheduling.reading import LatestReading
from gpusched.scheduling.starting import JobStarter
from gpusched.scheduling.stopping import stop_job
from gpusched.scheduling.submit_checks import check_fits
from gpusched.scheduling.waiting_ops import WaitingJobOperations
from gpusched.store import NewJob, NodeRow, Store

log = logging.getLogger("gpusched.scheduler")

# Running jobs stopped per hold of the lock by cancel_many (each is a write and a signal).
CANCEL_CHUNK = 200


class Scheduler:
    def __init__(
        self,
        context: Context,
        node: LocalNode | ClusterNode | None = None,
        *,
        client_alive: Callable[[int, str | None], bool] = is_same_process,
    ) -> None:
        """`node`: this daemon's ownership of jobs; a `ClusterNode` makes it one daemon of
        a cluster (its placer the cluster agent). `client_alive(pid, start time)`: whether
        an interactive job's client is still the process that asked."""
        self.context = context
        self.node = node or LocalNode()
        self._switch = DrainSwitch(context.config.state_dir)  # set by an administrator
        self.reading = LatestReading(context)
        self.endings = JobEndings(context, self.node, self.reading.gpus)
        context.launcher.on_exit = self.endings.on_job_exit
        self.waiting = WaitingJobOperations(context, self.endings)
        self.interactive = InteractiveJobs(context, self.endings, client_alive)
        self.starter = JobStarter(context, self.endings, self.node)
        if isinstance(self.node, ClusterNode):
            self.placer: Placer = ClusterAgent(
                context,
                endings=self.endings,
                starter=self.starter,
                node=self.node,
                reading=self.reading,
                drain=self._drain_now,
            )
        else:
            self.placer = LocalPlacer(
                context,
                endings=self.endings,
                starter=self.starter,
                node=self.node,
                reading=self.reading,
                drain=self._drain_now,
            )
        self._parts = Parts(
            context, self.node, self.endings, self.interactive, self.placer, self.reading
        )

    def _drain_now(self) -> Drain | None:
        return self._switch.current

    # The parts of the context, under the names the daemon's handlers use.
    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def drain(self) -> Drain | None:
        """An administrator's "start nothing new", if one is in force."""
        return self._switch.current

    @property
    def in_cluster(self) -> bool:
        """Whether this daemon shares its queue with others (scheduling.cluster)."""
        return self.placer.in_cluster

    @property
    def node_name(self) -> str:
        return self.node.name

    def clock(self) -> datetime:
        return self.context.clock()

    # -- the pass -------------------------------------------------------------------------

    def tick(self) -> Plan:
        """One pass (scheduling.phases): end abandoned database backends -> settle -> check
        interactive clients -> observe -> act on usage -> place -> publish, under the lock;
        then notify. Never raises for one bad job."""
        return run_pass(self._parts)

    def read_gpus(self) -> list[GpuState]:
        return self.reading.read_gpus()

    def current_gpus(self) -> list[GpuState]:
        return self.reading.gpus()

    def adopt_running(self) -> None:
        """After a (re)start: a `running` row is a claim to verify, not a fact."""
        adopt(self.context, self.endings)

    # -- operations requested by clients ------------------------------------------------------

    def submit(self, new: NewJob) -> Job:
        return self.submit_many([new], as_array=False)[0]

    def submit_many(self, news: list[NewJob], as_array: bool) -> list[Job]:
        """Check and queue jobs in one transaction (an array shares one array id)."""
        new = news[0]  # the jobs of one submit differ only in their command
        check_fits(new, self.placer.gpus_by_node(), self.context.config.headroom_bytes)
        found = self.store.jobs.get_many(new.after)
        for dep in new.after:
            if dep not in found:
                raise UsageError(f"--after {dep}: no job {dep}")
        # `max_queued` is counted and applied in the insert's own transaction (Store).
        max_queued = self.context.config.limits_for(new.user).max_queued
        jobs = self.store.jobs.add_many(
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
        if jobs[0].interactive:  # the next pass checks its client (interactive.py)
            self.interactive.note_submitted()
        self.context.wake()
        return jobs

    def cancel(
        self, job: Job, by: str, waiting_only: bool = False, detail: str | None = None
    ) -> Job:
        """`waiting_only`: refuse (ConflictError) if it has started, checked under the lock.
        `detail`: the reason's words instead of "cancelled by <by>"."""
        with self.context.lock:
            self._cancel_locked(job, detail or f"cancelled by {by}", waiting_only)
            self.context.wake()
            return self.store.jobs.get(job.id)

    def cancel_many(self, jobs: list[Job], by: str, waiting_only: bool = False) -> list[int]:
        """Cancel jobs (running ones, of `cancel --all` or of an array) a chunk per hold of
        the lock and with one wake-up: cancelling 1,000 running jobs one request each ran
        a scheduling pass between every two and took ten minutes. Returns the ids
        cancelled (a job that ended, or with `waiting_only` started, meanwhile is not)."""
        cancelled: list[int] = []
        for first in range(0, len(jobs), CANCEL_CHUNK):
            with self.context.lock:  # released between chunks: others' requests go on
                for job in jobs[first : first + CANCEL_CHUNK]:
                    try:
                        self._cancel_locked(job, f"cancelled by {by}", waiting_only)
                    except ConflictError:
                        continue
                    cancelled.append(job.id)
        if cancelled:
            self.context.wake()
        return cancelled

    def _cancel_locked(self, job: Job, detail: str, waiting_only: bool) -> None:
        job = self.store.jobs.get(job.id)
        if job.state in TERMINAL_STATES:
            raise ConflictError(f"job {job.id} has already ended ({job.state})")
        if waiting_only and job.state == JobState.RUNNING:
            raise ConflictError(f"job {job.id} has started")
        if job.state == JobState.RUNNING:
            stop_job(
                self.context,
                self.endings,
                self.interactive,
                job,
                intent=StopIntent.CANCEL,
                detail=detail,
            )
        else:
            self.endings.end(job.id, JobState.CANCELLED, EndReason.CANCELLED, detail=detail)

    def set_drain(self, drain: Drain | None) -> None:
        """Start nothing new (a Drain), or start again (None); kept across restarts. In a
        cluster, the node's row says so too: the scheduler places nothing on it."""
        with self.context.lock:
            self._switch.set(drain)
            self.placer.drain_node(self.node_name, drain)
        if drain is None:
            log.info("drain lifted: jobs start again")
        else:
            log.warning("%s: no new job starts until `gpusched undrain`", drain.describe())
        self.context.wake()

    def drain_node(self, name: str, drain: Drain | None) -> bool:
        """Drain (or undrain) another node of the cluster: False if there is none such."""
        return self.placer.drain_node(name, drain)

    # -- views ------------------------------------------------------------------------------

    def decorate(self, job: Job) -> Job:
        """Add what is known only in memory: why a queued job waits."""
        if job.state == JobState.HELD:
            job.waiting_reason = "held: release it with `gpusched release`"
        elif job.state == JobState.QUEUED:
            # In a cluster the elected scheduler's reason is in the row (job.waiting_reason).
            job.waiting_reason = (
                self.reading.latest.waiting_reasons.get(job.id)
                or job.waiting_reason
                or "waiting for the next scheduling pass"
            )
        elif job.state == JobState.RUNNING:
            job.warning = self.interactive.warnings.get(job.id)
            tracker = self.context.monitor.live(job.id)
            if tracker is not None:  # figures so far, from memory (written at the end)
                summary = tracker.summary()
                job.mem_used = tracker.mem_now if tracker.mem_samples else None
                job.peak_mem = max(job.peak_mem or 0, summary.pop("peak_mem") or 0) or None
                for key, value in summary.items():
                    setattr(job, key, value)
        return job

    def expected_start(self, job: Job) -> str | None:
        """A queued job's expected start (ISO 8601, UTC) where the head's claim and the
        `--time` of the jobs on its cards make one knowable; None: unknown
        (scheduling.expected_start)."""
        if job.state != JobState.QUEUED:
            return None
        claim = self.store.head_claims.current()
        if claim is None or claim.job_id != job.id:  # read no running job for the rest
            return None
        when = expected_start(job.id, claim, self.store.jobs.running(), self.clock())
        return None if when is None else iso(when)

    def job_timeline(self, job: Job) -> list[TimelinePoint]:
        """A job's memory and utilization over time, oldest first: for a running job, what
        this daemon holds in memory (the store lags it by up to a usage flush)."""
        if job.state == JobState.RUNNING:
            live = self.context.monitor.live_timeline(job.id)
            if live:
                return live
        return self.store.timeline.job_timeline(job.id)

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        """This server's GPUs; in a cluster, every node's that is not down."""
        return self.placer.gpu_reports([j for j in running if self.node.owns(j)])

    def nodes(self) -> list[NodeStatus]:
        """Every node, as `status` shows it: this server alone when it is not in a cluster."""
        return self.placer.nodes()

    def status_view(
        self, running: Callable[[], list[Job]], node_rows: list[NodeRow] | None = None
    ) -> tuple[list[GpuReport], list[NodeStatus]]:
        """`gpu_reports(running())` and `nodes()` as one reply shows them, each read once
        (`running` is asked only where the cards are drawn from this server's jobs;
        `node_rows`: the cluster's nodes as the reply read them already, else read here)."""

        def owned() -> list[Job]:
            return [j for j in running() if self.node.owns(j)]

        return self.placer.status_view(owned, node_rows)
