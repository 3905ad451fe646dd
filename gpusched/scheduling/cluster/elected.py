"""The cluster's scheduler: the one daemon elected through the `leases` row.

Each pass while elected (the agent, cluster.agent, asks): declare down the nodes whose
lease ran out more than the fence margin ago (one transaction each: epoch bumped,
running jobs `lost` or queued again, placed ones given back), then run the shared pass
rules (scheduling.pass_rules: the same as one server's) over every live node's reported
GPUs and every node's running and placed jobs, end the jobs whose dependency failed, and
write the placements, each conditioned on the election's epoch (store.placements). The
waiting reasons go into the jobs' rows, for every daemon's `status`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from datetime import datetime

from gpusched.scheduling.cluster.election import Role, may_declare_down, scheduler_role
from gpusched.scheduling.cluster.inputs import (
    NodeView,
    allowed_keys,
    cluster_claims,
    cluster_slots,
    split_key,
)
from gpusched.scheduling.cluster.node import ClusterNode
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.pass_rules import Restriction, decide
from gpusched.scheduling.placers import end_failed_dependencies
from gpusched.scheduling.policy import Plan, WaitingJob
from gpusched.scheduling.policy_inputs import running_demand, waiting_job
from gpusched.scheduling.quieter_waits import QuieterWaits
from gpusched.scheduling.ratelog import RateLimitedLog
from gpusched.store import NodePlacement, NodeRow, Queued
from gpusched.store.nodes import NODE_DOWN, NODE_UP

log = logging.getLogger("gpusched.cluster")


class ElectedScheduler:
    def __init__(
        self, context: Context, endings: JobEndings, node: ClusterNode, trouble: RateLimitedLog
    ) -> None:
        self.context = context
        self.node_records, self.placements = context.store.nodes, context.store.placements
        self.endings = endings
        self.node = node
        self.trouble = trouble
        self.election_epoch: int | None = None
        self._said: dict[int, str] = {}  # the waiting reasons last written
        self.waits = QuieterWaits()  # rule 3's bound; lost harmlessly if elected elsewhere
        self._written: dict[int, int] = {}  # job id -> the pass that last wrote its reason
        self._pass = 0

    def elected(self) -> bool:
        name, timeout_s = self.node.name, self.node.timeout_s
        try:
            lease = self.node_records.scheduler_lease()
            role = scheduler_role(lease, name, self.election_epoch)
            if role == Role.RENEW:
                if self.node_records.renew_scheduler(name, self.election_epoch or 0, timeout_s):
                    return not self.node.is_fenced()
                self.election_epoch = None
                return False
            if role == Role.TAKE:
                epoch = self.node_records.take_scheduler(name, lease, timeout_s)
                if epoch is not None:
                    log.info("node %s schedules the cluster (election epoch %s)", name, epoch)
                    self.election_epoch = epoch
                    return not self.node.is_fenced()
            if self.election_epoch is not None:
                log.info("node %s no longer schedules the cluster", name)
            self.election_epoch = None
        except Exception as exc:
            self.trouble.warning("elect", f"cannot read the scheduler's election: {exc!r}")
        return False

    def _declare_down(self, rows: list[NodeRow]) -> list[NodeRow]:
        """Declare down the nodes whose lease ran out more than the fence margin ago (by
        then the node has launched nothing for twice that margin: cluster.node); the rows
        still live."""
        live = []
        me = self.node.name
        margin_s = self.node.margin_s
        sure = may_declare_down(self.node.steady_for(), self.node.timeout_s)
        for row in rows:
            if row.state == NODE_DOWN:
                continue
            overdue = row.expired and row.age_s > self.node.timeout_s + margin_s
            if sure and overdue and row.name != me and self.election_epoch:
                why = f"node {row.name} was not heard from for {row.age_s:.0f}s"
                down = self.placements.declare_down(
                    row.name,
                    row.epoch,
                    holder=me,
                    election_epoch=self.election_epoch,
                    grace_s=margin_s,
                    why=why,
                )
                if down is not None:
                    log.warning(
                        "%s: declared down; %d job(s) lost, %d queued again",
                        why,
                        len(down.lost),
                        len(down.requeued),
                    )
                    self.endings.announce_ends(down.lost)
                    continue
            if not row.expired or row.name == me:
                live.append(row)
        return live

    def schedule(self) -> Plan:
        live = self._declare_down(self.node_records.node_rows())
        nodes = [NodeView.from_report(r.name, r.state == NODE_UP, r.report) for r in live]
        claimed = self.placements.claims()
        decision = decide(
            self.context,
            slots=cluster_slots(nodes),
            claims=cluster_claims(
                claimed,
                nodes,
                lambda job: running_demand(self.context.monitor, job),
                self.context.clock(),
            ),
            holding=claimed,
            gpus=[g for n in nodes for g in n.gpus],
            waits=self.waits,
            restrict=_on_nodes(nodes),
        )
        end_failed_dependencies(self.endings, decision.doomed)
        result = decision.plan
        index_of = {(n.name, g.uuid): g.index for n in nodes for g in n.gpus}
        placements = []
        for p in result.placements:
            where = [split_key(k) for k in p.gpu_uuids]
            node = where[0][0]
            uuids = tuple(u for _, u in where)
            indices = tuple(index_of[(node, u)] for u in uuids)
            placements.append(NodePlacement(p.job_id, node, uuids, indices))
        if placements and self.election_epoch is not None:
            placed = self.placements.place(placements, self.node.name, self.election_epoch)
            # Placed, they left the queue: the next pass need not read 10,000 rows for it.
            self.context.store.jobs.left_queue(placed)
            if len(placed) < len(placements):
                log.warning(
                    "%d of %d placements refused (the election moved on, or the jobs changed)",
                    len(placements) - len(placed),
                    len(placements),
                )
        self._publish(result.waiting_reasons)
        return result

    def _publish(self, reasons: dict[int, str]) -> None:
        """Write the waiting reasons that changed, for every daemon's `status`.

        A reason that changed only in the jobs it names (the head job it waits behind,
        which moves on with every start while a long queue drains, the busy jobs on a
        card) or in how long it has been held is rewritten at most
        REFRESH_PER_PASS rows a pass, the longest unwritten first: rewriting every waiting
        job's row each pass would make a 10,000-job queue drain at 2 jobs a second.
        Any other change is written at once."""
        self._pass += 1
        pending = {i: why for i, why in reasons.items() if self._said.get(i) != why}
        urgent = [i for i in pending if _shape(self._said.get(i)) != _shape(pending[i])]
        at_once = set(urgent)
        renamed = sorted(
            (i for i in pending if i not in at_once), key=lambda i: self._written.get(i, 0)
        )
        chosen = urgent + renamed[:REFRESH_PER_PASS]
        try:
            self.placements.set_waiting_reasons({i: pending[i] for i in chosen})
        except Exception as exc:  # only words for `status`: the next pass says them again
            self.trouble.warning("reasons", f"cannot record why jobs wait: {exc!r}")
            return
        said = {i: why for i, why in self._said.items() if i in reasons}
        for i in chosen:
            said[i] = pending[i]
            self._written[i] = self._pass
        self._said = said
        self._written = {i: n for i, n in self._written.items() if i in reasons}


# Rows a pass rewrites whose reason changed only in the job it names (see _publish).
REFRESH_PER_PASS = 200
# What in a reason moves on by itself while a long queue drains: the jobs it names (the
# head it waits behind, the busy jobs on a card: "job 5", "jobs 2, 4") and how long rule 3
# has held it ("for 3 min so far").
_MOVING = re.compile(r"\bjobs? \d+(?:, \d+)*|\bfor \d+ min so far")


def _shape(reason: str | None) -> str | None:
    """A reason with what moves on by itself left out (see _MOVING)."""
    return None if reason is None else _MOVING.sub("#", reason)


def _on_nodes(nodes: list[NodeView]) -> Restriction:
    """A job restricted to the nodes it may run on (`--node`, its user's, not drained)."""

    def restrict(job: Queued, now: datetime) -> tuple[WaitingJob | None, str | None]:
        keys, why = allowed_keys(job.user, job.allowed_nodes, nodes)
        if why is not None:
            return None, why
        wanted = waiting_job(job, now)
        return (wanted if keys is None else dataclasses.replace(wanted, gpu_keys=keys)), None

    return restrict
