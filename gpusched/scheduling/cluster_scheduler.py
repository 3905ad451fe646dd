"""The cluster's scheduler: the one daemon elected through the `leases` row.

Each pass while elected (scheduling.cluster's ClusterMember asks): declare down the nodes
whose lease ran out (one transaction each: epoch bumped, running jobs `lost` or queued
again, placed ones given back), then run the one-server policy `plan()` over every live
node's reported GPUs and every node's running and placed jobs, and write the placements,
each conditioned on the election's epoch (store.placements). The waiting reasons go into
the jobs' rows, for every daemon's `status`.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import TYPE_CHECKING

from gpusched.core.clock import iso
from gpusched.core.models import EndReason, JobState
from gpusched.scheduling.cluster_inputs import (
    NodeView,
    allowed_keys,
    cluster_claims,
    cluster_slots,
    split_key,
)
from gpusched.scheduling.election import Role, may_declare_down, scheduler_role
from gpusched.scheduling.fair_share import recent_usage
from gpusched.scheduling.policy import Plan, WaitingJob, plan
from gpusched.scheduling.policy_inputs import waiting_job
from gpusched.store import NodePlacement, NodeRow, Queued
from gpusched.store.nodes import NODE_DOWN, NODE_UP

if TYPE_CHECKING:
    from gpusched.scheduling.cluster import ClusterMember

log = logging.getLogger("gpusched.cluster")


class ClusterScheduler:
    def __init__(self, member: ClusterMember) -> None:
        self.member = member
        self.election_epoch: int | None = None
        self._said: dict[int, str] = {}  # the waiting reasons last written

    def elected(self) -> bool:
        try:
            lease = self.member.store.scheduler_lease()
            role = scheduler_role(lease, self.member.name, self.election_epoch)
            if role == Role.RENEW:
                if self.member.store.renew_scheduler(
                    self.member.name, self.election_epoch or 0, self.member.timeout_s
                ):
                    return not self.member.is_fenced()
                self.election_epoch = None
                return False
            if role == Role.TAKE:
                epoch = self.member.store.take_scheduler(
                    self.member.name, lease, self.member.timeout_s
                )
                if epoch is not None:
                    log.info(
                        "node %s schedules the cluster (election epoch %s)", self.member.name, epoch
                    )
                    self.election_epoch = epoch
                    return not self.member.is_fenced()
            if self.election_epoch is not None:
                log.info("node %s no longer schedules the cluster", self.member.name)
            self.election_epoch = None
        except Exception as exc:
            self.member.trouble.warning("elect", f"cannot read the scheduler's election: {exc!r}")
        return False

    def _declare_down(self, rows: list[NodeRow]) -> list[NodeRow]:
        """Declare down the nodes whose lease ran out; the rows still live."""
        live = []
        sure = may_declare_down(self.member.steady_for(), self.member.timeout_s)
        for row in rows:
            if row.state == NODE_DOWN:
                continue
            if sure and row.expired and row.name != self.member.name and self.election_epoch:
                why = f"node {row.name} was not heard from for {row.age_s:.0f}s"
                down = self.member.store.declare_down(
                    row.name,
                    row.epoch,
                    holder=self.member.name,
                    election_epoch=self.election_epoch,
                    now=iso(self.member.scheduler.clock()),
                    why=why,
                )
                if down is not None:
                    log.warning(
                        "%s: declared down; %d job(s) lost, %d queued again",
                        why,
                        len(down.lost),
                        len(down.requeued),
                    )
                    self.member.scheduler.endings.announce_ends(down.lost)
                    continue
            if not row.expired or row.name == self.member.name:
                live.append(row)
        return live

    def schedule(self) -> Plan:
        sched = self.member.scheduler
        config = sched.config
        live = self._declare_down(self.member.store.node_rows())
        nodes = [NodeView.from_report(r.name, r.state == NODE_UP, r.report) for r in live]
        admitted = sched.admit()
        for doomed in admitted.doomed:
            sched.endings.end(
                doomed.job_id, JobState.CANCELLED, EndReason.DEPENDENCY_FAILED, detail=doomed.detail
            )
        claimed = self.member.store.claims()
        now = sched.clock()
        reasons: dict[int, str] = {}
        waiting = []
        for job in admitted.eligible:
            keys, why = allowed_keys(job.user, job.allowed_nodes, nodes)
            if why is not None:
                reasons[job.id] = why
                continue
            waiting.append(waiting_job(job, now) if keys is None else _restricted(job, keys, now))
        users = {j.user for j in claimed} | {j.user for j in admitted.eligible}
        all_gpus = [g for n in nodes for g in n.gpus]
        result = plan(
            cluster_slots(nodes),
            cluster_claims(claimed, nodes),
            waiting,
            config.headroom_bytes,
            config.max_jobs_per_gpu,
            user_caps={user: sched.cap(user) for user in users},
            user_usage=recent_usage(
                self.member.store,
                admitted.eligible,
                all_gpus,
                sched.clock(),
                config.fair_share_half_life_s,
            ),
            busy_util=config.busy_util,
            head_claim=sched.head_claims.get(),
            placement=config.placement,
            pack=config.pack,
        )
        sched.head_claims.keep(result.head_claim)
        index_of = {(n.name, g.uuid): g.index for n in nodes for g in n.gpus}
        placements = []
        for p in result.placements:
            where = [split_key(k) for k in p.gpu_uuids]
            node = where[0][0]
            uuids = tuple(u for _, u in where)
            indices = tuple(index_of[(node, u)] for u in uuids)
            placements.append(NodePlacement(p.job_id, node, uuids, indices))
        if placements and self.election_epoch is not None:
            placed = self.member.store.place(placements, self.member.name, self.election_epoch)
            if len(placed) < len(placements):
                log.warning(
                    "%d of %d placements refused (the election moved on, or the jobs changed)",
                    len(placements) - len(placed),
                    len(placements),
                )
        reasons.update(result.waiting_reasons)
        self._publish(reasons)
        return Plan(result.placements, reasons, result.budgets)

    def _publish(self, reasons: dict[int, str]) -> None:
        """Write the waiting reasons that changed, for every daemon's `status`."""
        changed: dict[int, str | None] = {
            i: why for i, why in reasons.items() if self._said.get(i) != why
        }
        try:
            self.member.store.set_waiting_reasons(changed)
        except Exception as exc:  # only words for `status`: the next pass says them again
            self.member.trouble.warning("reasons", f"cannot record why jobs wait: {exc!r}")
            return
        self._said = dict(reasons)


def _restricted(job: Queued, keys: frozenset[str], now: datetime) -> WaitingJob:
    return dataclasses.replace(waiting_job(job, now), gpu_keys=keys)
