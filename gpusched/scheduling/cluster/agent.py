"""One daemon's part in a cluster, as its placer: the agent of its own server, and the
scheduler when elected.

Every pass (`place`), as AGENT: renew this node's lease (a conditional write on its name
and epoch, timed by the database's clock) with its GPUs as read now; if the lease was
refused, the node was declared down while it was away: stop what the cluster ended or
gave to another node, keep the jobs it ended `lost` whose processes still run here,
record from its exit record the end of each run of a job queued again that ended here
meanwhile (before rejoining: once back, nobody may start that job again), and rejoin:
the `lost` ones that still run are `running` again (counted on their cards, cancellable,
their real end recorded), and so are the jobs it queued again (`--requeue`) whose runs
still go on here and that have not started elsewhere since (taken back, not run twice).
Then ask the node's running jobs that were cancelled from elsewhere to stop; settle the
running rows it does not hold as the database does (a write whose answer was lost:
cluster.strays); if elected (one daemon at a time, through the `leases` row), schedule
the cluster (cluster.elected: the shared pass rules over every node); and start the jobs
placed on this node, each only while this node is inside its launch deadline
(cluster.node; the starter checks it again once its claim has committed, and the
supervisor before exec).
Between passes the daemon calls `poll` every half second: placements on this node and
cancels of its jobs take effect at once, whatever poll_interval is.

The host, pid, liveness of a pid and users' accounts come from the node's `Identity`,
time from the context's clock: tests run two agents on one store in one process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from gpusched.core.errors import ConfigError
from gpusched.core.models import Drain, EndReason, GpuReport, GpuState, Job, JobState, NodeStatus
from gpusched.processes.launching import OutcomeKind
from gpusched.processes.output import job_log_path
from gpusched.scheduling.cluster.clock import ClusterClock
from gpusched.scheduling.cluster.elected import ElectedScheduler
from gpusched.scheduling.cluster.inputs import NodeView, node_report
from gpusched.scheduling.cluster.node import ClusterNode
from gpusched.scheduling.cluster.strays import own_strays
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.gpu_reports import gpu_reports
from gpusched.scheduling.observe import Observation
from gpusched.scheduling.policy import Plan
from gpusched.scheduling.ratelog import RateLimitedLog
from gpusched.scheduling.reading import LatestReading
from gpusched.scheduling.starting import JobStarter
from gpusched.scheduling.stopping import stop_local
from gpusched.store import NodeGuard, NodeRow, RunHere
from gpusched.store.nodes import NODE_DOWN, NODE_DRAINED, NODE_UP

log = logging.getLogger("gpusched.cluster")


class ClusterAgent:
    in_cluster = True
    poll_every_s = 0.5

    def __init__(
        self,
        context: Context,
        *,
        endings: JobEndings,
        starter: JobStarter,
        node: ClusterNode,
        reading: LatestReading,
        drain: Callable[[], Drain | None],
    ) -> None:
        self.context = context
        self.jobs, self.placements = context.store.jobs, context.store.placements
        self.node_records = context.store.nodes
        self.attempts = context.store.attempts  # a requeued run taken back (_take_back)
        self.endings = endings
        self.starter = starter
        self.node = node
        self.reading = reading
        self.drain = drain
        self.trouble = RateLimitedLog(log)
        self.elect = ElectedScheduler(context, endings, node, self.trouble)
        self._signalled: set[int] = set()  # running jobs asked to stop (a cancel from elsewhere)
        self._seen_placed: set[int] = set()  # jobs placed here, as the last poll saw them

    @property
    def name(self) -> str:
        return self.node.name

    # -- joining --------------------------------------------------------------------------

    def join(self) -> None:
        """Take this node's name in the database, or refuse with one line if a live daemon
        holds it."""
        me = self.node.identity
        for _ in range(3):
            row = self.node_records.node_row(self.name)
            if row is not None and row.owner and row.state != NODE_DOWN and not row.expired:
                host, _, pid = row.owner.rpartition(":")
                mine = host == me.host and pid.isdigit()
                if not mine or (int(pid) != me.pid and me.alive(int(pid))):
                    raise ConfigError(
                        f"node {self.name} is already live on this database (daemon"
                        f" {row.owner}, heard {row.age_s:.0f}s ago): give this server"
                        " another `node:` name"
                    )
            sent_at = self.context.clock.monotonic()
            epoch = self.node_records.claim_node(self.name, me.owner, self.node.timeout_s, row)
            if epoch > 0:
                self.node.renewed(epoch, sent_at)
                log.info("node %s joined the cluster (epoch %s)", self.name, epoch)
                drain = self.drain()
                if drain is not None:  # drained before this start: kept across restarts
                    self.node_records.set_node_state(self.name, NODE_DRAINED, drain.describe())
                return
        raise ConfigError(f"node {self.name}: another daemon keeps taking this name")

    def leave(self) -> None:
        try:
            self.node_records.release_node(self.name, self.node.epoch)
        except Exception:  # a database gone at shutdown: the lease runs out by itself
            log.warning("could not release node %s's lease", self.name)

    def reconcile_at_start(self, job_ids_here: Callable[[], list[int]]) -> None:
        """At start, after adoption (which settles this node's `running` rows): of the
        jobs this server ran (`job_ids_here`: those it keeps a directory for, listed only
        now), a job ended `lost` with this node is settled from its exit record if its
        supervisor is gone, and watched (and `running` again) if it still runs; a job
        queued again whose run still goes on here is taken back (_take_back) if it has not
        started elsewhere since; a live copy of any other job that is not this node's
        running one (held, ended, running elsewhere) is stopped."""
        launcher = self.context.launcher
        ids = job_ids_here()
        revived: list[int] = []
        back: list[int] = []
        for start in range(0, len(ids), 500):
            rows = self.placements.rows_of(ids[start : start + 500])
            for job_id, (state, node, _epoch) in rows.items():
                mine = node == self.name
                if state == JobState.RUNNING and mine:
                    continue  # adopt_running's: watched, or settled from its record
                pid = launcher.find_supervisor(job_id)
                began = launcher.start_time(pid) if pid is not None else None
                lost_here = (
                    state == JobState.LOST
                    and mine
                    and self.jobs.get(job_id).reason == EndReason.NODE_LOST
                )
                if pid is None or began is None:  # its supervisor is gone
                    if lost_here or state in (JobState.QUEUED, JobState.HELD, JobState.RUNNING):
                        self._settle_from_record(job_id)  # lost, or a requeued run's end
                elif lost_here or state == JobState.QUEUED:
                    log.info("job %s, %s with this node, still runs: watched", job_id, state)
                    self.node.started(job_id, pid, began)
                    launcher.watch(job_id, pid, began)
                    (revived if lost_here else back).append(job_id)
                else:
                    log.warning("job %s is %s here: stopping its copy", job_id, _elsewhere(state))
                    launcher.cancel(pid, began)
        self._take_back(back)  # queued again from here: taken back unless run elsewhere
        self._revive(revived)

    def _settle_from_record(self, job_id: int) -> None:
        """A job ended `lost` with this node (or queued again from it) whose run ended
        while this daemon was away: its real end, from its supervisor's exit record
        (none: nothing to say). JobEndings.settle decides what the end is worth."""
        outcome = self.context.launcher.outcome(job_id)
        if outcome.kind == OutcomeKind.LOST:
            return
        log.info("job %s ended while this node was away: its end recorded", job_id)
        with self.context.lock:
            self.endings.settle(job_id, outcome)

    def _revive(self, job_ids: list[int]) -> None:
        """Jobs ended `lost` with this node whose processes still run here: `running` again
        under the node's current epoch, so their cards count them, `cancel` reaches them
        and `wait` returns their real end."""
        if not job_ids:
            return
        epoch = self.node.epoch
        for job_id in self.placements.revive_lost(self.name, epoch, job_ids):
            _old, pid, began = self.node.local[job_id]
            self.node.local[job_id] = (epoch, pid, began)
            log.info("job %s, ended lost with this node, runs here: running again", job_id)

    # -- views and an administrator's drain --------------------------------------------

    def nodes(self, rows: list[NodeRow] | None = None) -> list[NodeStatus]:
        """Every node of the cluster; one whose lease ran out shows `down` already.
        `rows`: the nodes as read already (store.jobs.active_page), else read here."""
        shown = []
        for row in self.node_records.node_rows() if rows is None else rows:
            state = NODE_DOWN if row.expired and row.state != NODE_DRAINED else row.state
            gpus = [
                dataclasses.replace(GpuReport.from_json(g), node=row.name)
                for g in row.report.get("reports", [])
            ]
            shown.append(NodeStatus(row.name, state, round(row.age_s, 1), gpus))
        return shown

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        """Every node's GPUs that is not down."""
        return self.status_view(lambda: running)[0]

    def status_view(
        self, running: Callable[[], list[Job]], node_rows: list[NodeRow] | None = None
    ) -> tuple[list[GpuReport], list[NodeStatus]]:
        """Both from one read of the nodes' reports, `node_rows` if given (running jobs
        are not read: each node's report already counts its own)."""
        nodes = self.nodes(node_rows)
        return [g for node in nodes for g in node.gpus if node.state != NODE_DOWN], nodes

    def gpus_by_node(self) -> dict[str, list[GpuState] | None]:
        """Each live node's GPUs as last reported (this node's as read now); None for a
        node that joined and has not reported yet."""
        found: dict[str, list[GpuState] | None] = {}
        for row in self.node_records.node_rows():
            if row.state != NODE_DOWN and not row.expired:
                reported = "gpus" in row.report
                view = NodeView.from_report(row.name, True, row.report)
                found[row.name] = list(view.gpus) if reported else None
        found[self.name] = self.reading.read_gpus()
        return found

    def drain_node(self, name: str, drain: Drain | None) -> bool:
        state = NODE_UP if drain is None else NODE_DRAINED
        done = self.node_records.set_node_state(
            name, state, None if drain is None else drain.describe()
        )
        if done:
            log.warning("node %s %s", name, "undrained" if drain is None else drain.describe())
        return done

    # -- the pass -------------------------------------------------------------------------

    def place(self, seen: Observation) -> Plan | None:
        """The place phase: renew -> stop what was cancelled elsewhere -> settle the
        running rows this node does not hold -> if elected, the shared pass rules over
        every node -> start what was placed here."""
        headroom = self.context.config.headroom_bytes
        reports = gpu_reports(
            seen.gpus,
            seen.usage,
            seen.running,
            headroom,
            jobs_pids=seen.jobs_pids,
            seen_pids=seen.seen_pids,
        )
        self._renew(seen, reports)
        self._stop_cancelled(seen.running)
        own_strays(self.context, self.endings, self.node, seen.running)
        result = None
        if self.elect.elected():
            result = self.elect.schedule()
        self._start_placed(seen)
        return result

    def _renew(self, seen: Observation, reports: list[GpuReport]) -> None:
        monitor = self.context.monitor
        util = {g.uuid: monitor.gpu_util(g.uuid) for g in seen.gpus}
        report = node_report(seen.gpus, seen.usage, util, reports, self._missing_users())
        node = self.node
        try:
            # Read before sending: the lease the database grants runs from a later moment.
            sent_at = self.context.clock.monotonic()
            clock = self.context.clock
            learning = clock if isinstance(clock, ClusterClock) else None
            sent = None if learning is None else learning.local()
            renewed = self.node_records.renew_node(self.name, node.epoch, node.timeout_s, report)
            if renewed is not None:
                node.renewed(node.epoch, sent_at)
                if learning is not None and sent is not None:  # timestamps on its clock
                    learning.learn(renewed, sent, learning.local())
                return
            row = self.node_records.node_row(self.name)
        except Exception as exc:  # the database is away: fenced once it has been too long
            self.trouble.warning("renew", f"cannot renew node {self.name}'s lease: {exc!r}")
            return
        if row is None or row.epoch == node.epoch:
            return
        log.warning(
            "node %s was declared down while away (epoch %s -> %s): reconciling",
            self.name,
            node.epoch,
            row.epoch,
        )
        back = self._reconcile()
        sent_at = self.context.clock.monotonic()
        epoch = self.node_records.claim_node(self.name, node.identity.owner, node.timeout_s, row)
        if epoch > 0:
            node.renewed(epoch, sent_at)
            log.info("node %s rejoined the cluster (epoch %s)", self.name, epoch)
            self._take_back(back)
            self._revive([i for i in node.local if i not in back])

    def _reconcile(self) -> list[int]:
        """Back from being declared down, before rejoining: stop the processes of jobs
        the cluster ended otherwise or started elsewhere; those it ended `lost` run on,
        their end reported later; a run of a job queued again (or started elsewhere) that
        ended here meanwhile is settled from its exit record now (_settle_from_record:
        the job's end if it did not start again); the requeued ones still queued, whose
        runs go on here, are returned, to be taken back once this node has rejoined
        (_take_back)."""
        launcher = self.context.launcher
        local = self.node.local
        rows = self.placements.rows_of(list(local))
        back: list[int] = []
        for job_id, (_epoch, pid, start_time) in list(local.items()):
            state, node, _ = rows.get(job_id, (JobState.LOST, None, None))
            if state == JobState.LOST and node == self.name:
                continue  # lost with this node: still ours, its real end will be recorded
            running = launcher.is_running(pid, start_time)
            if state == JobState.QUEUED and running:
                back.append(job_id)  # queued again, not started elsewhere: ours to take back
                continue
            if not running and state in (JobState.QUEUED, JobState.HELD, JobState.RUNNING):
                # Read here, not left to the exit watcher: the watcher may be heard only
                # after this node has rejoined, and by then the scheduler may have started
                # the job again, here or elsewhere. Before the rejoin, nothing can be
                # placed here yet; a failure here fails the pass before the rejoin, and
                # the next pass reads the record again.
                self._settle_from_record(job_id)  # an end recorded drops it from `local`
            local.pop(job_id, None)
            if running:
                log.warning("job %s was given to the cluster again: stopping it here", job_id)
                launcher.cancel(pid, start_time)
        return back

    def _take_back(self, job_ids: list[int]) -> None:
        """Requeued jobs whose runs still go on here, this node back: `running` here again
        as they were (store `take_back_requeued`: only if still queued and last run here),
        so they are not run a second time; any the database refuses (started elsewhere
        meanwhile) is stopped here."""
        if not job_ids:
            return
        node = self.node
        launcher = self.context.launcher
        jobs = self.jobs.get_many(job_ids)
        runs = []
        for job_id in job_ids:
            _old, pid, began = node.local[job_id]
            default = str(launcher.log_path(job_id))
            job = jobs.get(job_id)
            log_path = default if job is None else job_log_path(job, default)
            runs.append(RunHere(job_id, pid, began, log_path))
        taken = set(self.attempts.take_back_requeued(self.name, node.epoch, runs))
        for job_id in job_ids:
            _old, pid, began = node.local[job_id]
            if job_id in taken:
                node.local[job_id] = (node.epoch, pid, began)
                log.warning(
                    "job %s, queued again when node %s was declared down, still runs here:"
                    " taken back (running here again, not run twice)",
                    job_id,
                    self.name,
                )
                continue
            del node.local[job_id]
            if launcher.is_running(pid, began):
                log.warning("job %s was given to the cluster again: stopping it here", job_id)
                launcher.cancel(pid, began)

    def _missing_users(self) -> set[str]:
        account = self.node.identity.account
        return {user for user in self.node_records.waiting_users() if account(user) is None}

    def poll(self) -> None:
        """Between passes (the daemon calls it every half second): a pass at once when the
        scheduler placed new jobs here, and the cancels from other servers (poll_cancels).
        Two indexed reads when there is nothing to do."""
        placed = set(self.placements.placed_ids(self.name))
        if placed - self._seen_placed:
            self.context.wake()
        self._seen_placed = placed
        self.poll_cancels()

    def poll_cancels(self) -> None:
        """Stop this node's jobs cancelled from another server, so that a cancel takes
        effect within two seconds whatever poll_interval is."""
        wanted = [i for i in self.placements.stop_requested(self.name) if i not in self._signalled]
        if not wanted:
            return
        with self.context.lock:
            for job in self.jobs.get_many(wanted).values():
                if job.state == JobState.RUNNING and self.node.owns(job):
                    self._signalled.add(job.id)
                    stop_local(self.context, self.endings, job)

    def _stop_cancelled(self, running: list[Job]) -> None:
        """Running jobs of this node that a daemon elsewhere asked to stop (the poll)."""
        for job_id in self.placements.stop_requested(self.name):
            if job_id in self._signalled:
                continue
            self._signalled.add(job_id)
            job = next((j for j in running if j.id == job_id), None)
            if job is not None:
                stop_local(self.context, self.endings, job)
        self._signalled &= {j.id for j in running}

    def _start_placed(self, seen: Observation) -> None:
        by_uuid = {g.uuid: g for g in seen.gpus}
        guard = NodeGuard(self.name, self.node.epoch)
        for job in self.placements.placed(self.name):
            if self.node.is_fenced():  # each start can take a while: checked before each
                return
            gpus = [by_uuid[u] for u in job.gpu_uuids if u in by_uuid]
            account = self.node.identity.account(job.user)
            if account is None or len(gpus) != len(job.gpu_uuids):
                self.placements.unplace(job.id, self.name)
                continue
            self.starter.start_placed(job, gpus, guard, account)


def _elsewhere(state: JobState) -> str:
    """Why a copy of a job is not this node's to run, for the log."""
    if state in (JobState.QUEUED, JobState.HELD):
        return "queued again"
    if state == JobState.RUNNING:
        return "running on another node"
    return f"{state} already"
