"""One daemon's part in a cluster: the agent of its own server, and the scheduler when elected.

Every pass, as AGENT: renew this node's lease (a conditional write on its name and
epoch, timed by the database's clock) with its GPUs as read now; if the lease was
refused, the node was declared down while it was away: stop what the cluster gave to
another node, keep the jobs it ended `lost` (their real end is reported when they end),
and rejoin. Then ask the node's running jobs that were cancelled from elsewhere to stop,
and start the jobs placed on this node, unless fenced (election.fenced).

As SCHEDULER (one daemon at a time, elected through the `leases` row): module
cluster_scheduler. Between passes the daemon calls `poll` every half second: placements
on this node and cancels of its jobs take effect at once, whatever poll_interval is.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
import socket
import time
from typing import TYPE_CHECKING

from gpusched.core.errors import ConfigError
from gpusched.core.models import (
    Drain,
    EndReason,
    GpuReport,
    GpuState,
    Job,
    JobState,
    NodeStatus,
)
from gpusched.core.ratelog import RateLimitedLog
from gpusched.scheduling.cluster_inputs import (
    NodeView,
    node_report,
)
from gpusched.scheduling.cluster_scheduler import ClusterScheduler
from gpusched.scheduling.election import fenced
from gpusched.scheduling.observe import Observation
from gpusched.scheduling.policy import Plan
from gpusched.store import NodeGuard
from gpusched.store.nodes import NODE_DOWN, NODE_DRAINED, NODE_UP

if TYPE_CHECKING:
    from gpusched.scheduling.scheduler import Scheduler

log = logging.getLogger("gpusched.cluster")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ClusterMember:
    def __init__(self, scheduler: Scheduler, name: str) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.name = name
        self.host = socket.gethostname()
        self.owner = f"{self.host}:{os.getpid()}"
        self.epoch = 0
        self.elect = ClusterScheduler(self)  # this daemon's part when it is elected
        self._renewed_at: float | None = None  # monotonic time of the last renewal
        self._steady_since = time.monotonic()  # renewing without a gap since (see below)
        self._signalled: set[int] = set()  # running jobs asked to stop (a cancel from elsewhere)
        # Processes started (or adopted) here: job id -> (epoch, pid, start time).
        self.local: dict[int, tuple[int, int, str | None]] = {}
        self.trouble = RateLimitedLog(log)
        self._seen_placed: set[int] = set()  # jobs placed here, as the last poll saw them
        endings = scheduler.endings
        endings.owns = self.owns
        endings.guard_for = self.guard_for
        endings.adopted = self.adopted
        endings.recheck_s = 1.0  # ends written by other daemons notify nobody here
        scheduler.starter.node = name
        scheduler.starter.on_started = self._started
        scheduler.end_listeners.append(self._ended)

    @property
    def timeout_s(self) -> float:
        return self.scheduler.config.node_timeout_s

    # -- joining --------------------------------------------------------------------------

    def join(self) -> None:
        """Take this node's name in the database, or refuse with one line if a live daemon
        holds it."""
        for _ in range(3):
            row = self.store.node_row(self.name)
            if row is not None and row.owner and row.state != NODE_DOWN and not row.expired:
                host, _, pid = row.owner.rpartition(":")
                mine = host == self.host and pid.isdigit()
                if not mine or (int(pid) != os.getpid() and _alive(int(pid))):
                    raise ConfigError(
                        f"node {self.name} is already live on this database (daemon"
                        f" {row.owner}, heard {row.age_s:.0f}s ago): give this server"
                        " another `node:` name"
                    )
            epoch = self.store.claim_node(self.name, self.owner, self.timeout_s, row)
            if epoch > 0:
                self.epoch = epoch
                self._renewed_at = time.monotonic()
                log.info("node %s joined the cluster (epoch %s)", self.name, epoch)
                drain = self.scheduler.drain
                if drain is not None:  # drained before this start: kept across restarts
                    self.store.set_node_state(self.name, NODE_DRAINED, drain.describe())
                return
        raise ConfigError(f"node {self.name}: another daemon keeps taking this name")

    def leave(self) -> None:
        try:
            self.store.release_node(self.name, self.epoch)
        except Exception:  # a database gone at shutdown: the lease runs out by itself
            log.warning("could not release node %s's lease", self.name)

    def owns(self, job: Job) -> bool:
        return job.node == self.name

    def guard_for(self, job_id: int) -> NodeGuard:
        started = self.local.get(job_id)
        return NodeGuard(self.name, started[0] if started else self.epoch)

    def _ended(self, job_id: int, _hooks_due: bool) -> None:
        self.local.pop(job_id, None)

    def _started(self, job_id: int, pid: int, start_time: str) -> None:
        self.local[job_id] = (self.epoch, pid, start_time)

    def adopted(self, job: Job, pid: int, start_time: str | None) -> None:
        self.local[job.id] = (self.epoch, pid, start_time)

    def reconcile_at_start(self, job_ids_here: list[int]) -> None:
        """At start, after adoption: of the jobs this server ran (`job_ids_here`: those it
        keeps a directory for), stop the supervisors of jobs the cluster gave back to the
        queue while this daemon was away, and watch again those of jobs ended `lost` with
        this node, whose real end is then recorded when they exit."""
        launcher = self.scheduler.launcher
        for start in range(0, len(job_ids_here), 500):
            rows = self.store.rows_of(job_ids_here[start : start + 500])
            for job_id, (state, node, _epoch) in rows.items():
                lost_here = state == JobState.LOST and node == self.name
                given_back = state in (JobState.QUEUED, JobState.HELD) or (
                    state == JobState.RUNNING and node != self.name
                )
                if not (lost_here or given_back):
                    continue
                pid = launcher.find_supervisor(job_id)
                began = launcher.start_time(pid) if pid is not None else None
                if pid is None or began is None:
                    continue
                if given_back:
                    log.warning("job %s was given to the cluster again: stopping it here", job_id)
                    launcher.cancel(pid, began)
                    continue
                job = self.store.get(job_id)
                if job.reason == EndReason.NODE_LOST:
                    log.info("job %s, ended lost with this node, still runs: watched", job_id)
                    self.local[job_id] = (self.epoch, pid, began)
                    launcher.watch(job_id, pid, began)

    # -- views and an administrator's drain --------------------------------------------

    def nodes_status(self) -> list[NodeStatus]:
        """Every node of the cluster; one whose lease ran out shows `down` already."""
        shown = []
        for row in self.store.node_rows():
            state = NODE_DOWN if row.expired and row.state != NODE_DRAINED else row.state
            gpus = [
                dataclasses.replace(GpuReport.from_json(g), node=row.name)
                for g in row.report.get("reports", [])
            ]
            shown.append(NodeStatus(row.name, state, round(row.age_s, 1), gpus))
        return shown

    def gpus_by_node(self) -> dict[str, list[GpuState]]:
        """Each live node's GPUs as last reported (this node's as read now)."""
        found: dict[str, list[GpuState]] = {}
        for row in self.store.node_rows():
            if row.state != NODE_DOWN and not row.expired:
                found[row.name] = list(NodeView.from_report(row.name, True, row.report).gpus)
        found[self.name] = self.scheduler.read_gpus()
        return found

    def drain_node(self, name: str, drain: Drain | None) -> bool:
        state = NODE_UP if drain is None else NODE_DRAINED
        done = self.store.set_node_state(name, state, None if drain is None else drain.describe())
        if done:
            log.warning("node %s %s", name, "undrained" if drain is None else drain.describe())
        return done

    # -- the pass -------------------------------------------------------------------------

    def tick(self, seen: Observation, reports: list[GpuReport]) -> Plan | None:
        """One pass (under the scheduler's lock, after `seen` was observed)."""
        self._renew(seen, reports)
        self._stop_cancelled(seen.running)
        result = None
        if self.elect.elected():
            result = self.elect.schedule()
        if not self.is_fenced():
            self._start_placed(seen)
        return result

    def steady_for(self) -> float:
        """Seconds this daemon has renewed its lease without a gap (since it joined, or
        since it came back from being unable to): the scheduler declares no node down
        before this reaches node_timeout, since the others may be coming back too."""
        return time.monotonic() - self._steady_since

    def is_fenced(self) -> bool:
        since = None if self._renewed_at is None else time.monotonic() - self._renewed_at
        return fenced(since, self.timeout_s, self.scheduler.config.poll_interval_s)

    def _renew(self, seen: Observation, reports: list[GpuReport]) -> None:
        util = {g.uuid: self.scheduler.monitor.gpu_util(g.uuid) for g in seen.gpus}
        report = node_report(seen.gpus, seen.usage, util, reports, self._missing_users())
        try:
            if self.store.renew_node(self.name, self.epoch, self.timeout_s, report):
                if self.is_fenced():  # back from a gap (the database away, a pause)
                    self._steady_since = time.monotonic()
                self._renewed_at = time.monotonic()
                return
            row = self.store.node_row(self.name)
        except Exception as exc:  # the database is away: fenced once it has been too long
            self.trouble.warning("renew", f"cannot renew node {self.name}'s lease: {exc!r}")
            return
        if row is None or row.epoch == self.epoch:
            return
        log.warning(
            "node %s was declared down while away (epoch %s -> %s): reconciling",
            self.name,
            self.epoch,
            row.epoch,
        )
        self._reconcile()
        epoch = self.store.claim_node(self.name, self.owner, self.timeout_s, row)
        if epoch > 0:
            self.epoch = epoch
            self._renewed_at = time.monotonic()
            log.info("node %s rejoined the cluster (epoch %s)", self.name, epoch)

    def _reconcile(self) -> None:
        """Back from being declared down: stop the processes of jobs the cluster queued
        again or ended otherwise; those it ended `lost` run on, their end reported later."""
        launcher = self.scheduler.launcher
        rows = self.store.rows_of(list(self.local))
        for job_id, (_epoch, pid, start_time) in list(self.local.items()):
            state, node, _ = rows.get(job_id, (JobState.LOST, None, None))
            if state == JobState.LOST and node == self.name:
                continue  # lost with this node: still ours, its real end will be recorded
            del self.local[job_id]
            if launcher.is_running(pid, start_time):
                log.warning("job %s was given to the cluster again: stopping it here", job_id)
                launcher.cancel(pid, start_time)

    def _missing_users(self) -> set[str]:
        missing = set()
        for user in {job.user for job in self.store.queued()}:
            try:
                pwd.getpwnam(user)
            except KeyError:
                missing.add(user)
        return missing

    def poll(self) -> None:
        """Between passes (the daemon calls it every half second): a pass at once when the
        scheduler placed new jobs here, and the cancels from other servers (poll_cancels).
        Two indexed reads when there is nothing to do."""
        placed = set(self.store.placed_ids(self.name))
        if placed - self._seen_placed:
            self.scheduler.wake()
        self._seen_placed = placed
        self.poll_cancels()

    def poll_cancels(self) -> None:
        """Stop this node's jobs cancelled from another server, so that a cancel takes
        effect within two seconds whatever poll_interval is."""
        wanted = [i for i in self.store.stop_requested(self.name) if i not in self._signalled]
        if not wanted:
            return
        with self.scheduler.lock:
            for job in self.store.get_many(wanted).values():
                if job.state == JobState.RUNNING and self.owns(job):
                    self._signalled.add(job.id)
                    self.scheduler.stop_local(job)

    def _stop_cancelled(self, running: list[Job]) -> None:
        """Running jobs of this node that a daemon elsewhere asked to stop (the poll)."""
        for job_id in self.store.stop_requested(self.name):
            if job_id in self._signalled:
                continue
            self._signalled.add(job_id)
            job = next((j for j in running if j.id == job_id), None)
            if job is not None:
                self.scheduler.stop_local(job)
        self._signalled &= {j.id for j in running}

    def _start_placed(self, seen: Observation) -> None:
        by_uuid = {g.uuid: g for g in seen.gpus}
        guard = NodeGuard(self.name, self.epoch)
        for job in self.store.placed(self.name):
            gpus = [by_uuid[u] for u in job.gpu_uuids if u in by_uuid]
            try:
                pwd.getpwnam(job.user)
            except KeyError:
                gpus = []
            if len(gpus) != len(job.gpu_uuids):
                self.store.unplace(job.id, self.name)
                continue
            self.scheduler.starter.start_placed(job, gpus, guard)
