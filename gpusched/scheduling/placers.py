"""Who places the queued jobs, and where the place phase of each pass goes: a strategy.

`Placer` is what the scheduler's pass and its views ask of it. `LocalPlacer`, one
server: the shared pass rules (scheduling.pass_rules) over its own GPUs, then end the
jobs whose dependency failed (`end_failed_dependencies`, both placers') and start what
they placed. `ClusterAgent` (scheduling.cluster.agent), one daemon of a cluster: renew
the node's lease, stop what was cancelled elsewhere, if elected the same shared rules
over every node, then start what was placed on this node. Each is built once, with the
pass's context and the parts it acts through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Protocol

from gpusched.core.models import Drain, EndReason, GpuReport, GpuState, Job, JobState, NodeStatus
from gpusched.scheduling.admission import DependencyFailed
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.gpu_reports import gpu_reports
from gpusched.scheduling.host_limits import host_room
from gpusched.scheduling.observe import Observation
from gpusched.scheduling.ownership import LocalNode
from gpusched.scheduling.pass_rules import decide
from gpusched.scheduling.policy import Plan
from gpusched.scheduling.policy_inputs import (
    WaitingJobs,
    gpu_slot,
    gpu_topology,
    running_claims,
    running_demand,
)
from gpusched.scheduling.quieter_waits import QuieterWaits
from gpusched.scheduling.reading import LatestReading
from gpusched.scheduling.starting import JobStarter
from gpusched.store import NodeRow


def end_failed_dependencies(endings: JobEndings, doomed: Iterable[DependencyFailed]) -> None:
    """End the queued jobs a pass found can never run, a dependency having failed: the
    first of a placer's acts on a `Decision` (scheduling.pass_rules), before its plan."""
    for failed in doomed:
        endings.end(
            failed.job_id, JobState.CANCELLED, EndReason.DEPENDENCY_FAILED, detail=failed.detail
        )


class Placer(Protocol):
    @property
    def in_cluster(self) -> bool:
        """Whether the queue is shared with other daemons (a job's uid means nothing
        on another server: jobs are matched to callers by user name)."""

    @property
    def poll_every_s(self) -> float | None:
        """How often the daemon calls `poll` between passes (None: never)."""

    def place(self, seen: Observation) -> Plan | None:
        """The place phase of a pass, under the lock: decide and start. None: nothing
        was decided here (another daemon schedules the cluster)."""

    def gpus_by_node(self) -> dict[str, list[GpuState] | None]:
        """Every node's GPUs a submitted job could run on (a submit's fit check); None
        for a node whose cards are not known yet."""

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        """The GPUs `status` shows."""

    def nodes(self) -> list[NodeStatus]:
        """The nodes `status` shows."""

    def status_view(
        self, running: Callable[[], list[Job]], node_rows: list[NodeRow] | None = None
    ) -> tuple[list[GpuReport], list[NodeStatus]]:
        """`gpu_reports` and `nodes` read once for one reply (`running`: this node's
        running jobs, read only by a placer that needs them; `node_rows`: the cluster's
        nodes if the reply read them already)."""

    def drain_node(self, name: str, drain: Drain | None) -> bool:
        """Drain (or undrain) node `name` for the cluster: False if there is none such."""

    def join(self) -> None:
        """At start, before any pass."""

    def reconcile_at_start(self, job_ids_here: Callable[[], list[int]]) -> None:
        """At start, after adoption: `job_ids_here` lists the jobs this server ran."""

    def poll(self) -> None:
        """Between passes, every `poll_every_s`."""

    def leave(self) -> None:
        """At a clean stop."""


class LocalPlacer:
    """One server: the shared pass rules -> end the jobs whose dependency failed ->
    start what was placed."""

    in_cluster = False
    poll_every_s = None

    def __init__(
        self,
        context: Context,
        *,
        endings: JobEndings,
        starter: JobStarter,
        node: LocalNode,
        reading: LatestReading,
        drain: Callable[[], Drain | None],
    ) -> None:
        self.context = context
        self.endings = endings
        self.starter = starter
        self.node = node
        self.reading = reading
        self.drain = drain
        self.waits = QuieterWaits()
        # Kept between passes: a long queue's unchanged jobs keep their views.
        self.waiting_jobs = WaitingJobs()

    def place(self, seen: Observation) -> Plan:
        monitor = self.context.monitor
        drain = self.drain()
        self.waiting_jobs.new_pass()
        decision = decide(
            self.context,
            slots=[
                gpu_slot(g, monitor.gpu_util(g.uuid), seen.outsiders.get(g.uuid)) for g in seen.gpus
            ],
            claims=running_claims(
                seen.running,
                seen.usage,
                monitor.job_util,
                self.context.clock(),
                peak_of=monitor.peak,
                demand_of=lambda job: running_demand(monitor, job),
            ),
            holding=seen.running,
            gpus=seen.gpus,
            waits=self.waits,
            restrict=self.waiting_jobs.anywhere,
            views=self.waiting_jobs.views,
            held_back=None if drain is None else f"{drain.describe()}: no new job starts",
            topology=gpu_topology(self.context.probe),
            hosts={"": host_room(self.context.launcher.host_facts(), self.context.config)},
        )
        end_failed_dependencies(self.endings, decision.doomed)
        self.starter.start(decision.plan.placements, seen.gpus)
        return decision.plan

    def gpus_by_node(self) -> dict[str, list[GpuState] | None]:
        return {self.node.name: self.reading.gpus()}

    def gpu_reports(self, running: list[Job]) -> list[GpuReport]:
        latest = self.reading.latest
        headroom = self.context.config.headroom_bytes
        # The socket answers before the first pass ends: its cards are then read now.
        gpus = self.reading.gpus()
        reports = gpu_reports(
            gpus,
            latest.usage,
            running,
            headroom,
            jobs_pids=latest.jobs_pids,
            seen_pids=latest.seen_pids,
        )
        return [dataclasses.replace(r, node=self.node.name or None) for r in reports]

    def nodes(self) -> list[NodeStatus]:
        state = "drained" if self.drain() is not None else "up"
        return [NodeStatus(self.node.name, state, 0.0, self.gpu_reports([]))]

    def status_view(
        self, running: Callable[[], list[Job]], node_rows: list[NodeRow] | None = None
    ) -> tuple[list[GpuReport], list[NodeStatus]]:
        return self.gpu_reports(running()), self.nodes()

    def drain_node(self, name: str, drain: Drain | None) -> bool:
        return False  # one server: its own drain is the scheduler's (set_drain)

    def join(self) -> None:
        pass

    def reconcile_at_start(self, job_ids_here: Callable[[], list[int]]) -> None:
        pass

    def poll(self) -> None:
        pass

    def leave(self) -> None:
        pass
