"""The cluster-wide plan's inputs: every live node's reported GPUs as one list of slots.

Pure. A GPU's key in the plan is `node/uuid` (two servers' cards may share a uuid when
simulated, and a uuid means nothing without its server); each job's claim, running or
placed, is keyed the same way; a waiting job restricted to some nodes (`--node`, the
nodes where its user exists, the nodes not drained) gets the keys of their GPUs. What a
node reports is made by `node_report` on the agent's side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpusched.core.models import GpuHealth, GpuReport, GpuState, Job
from gpusched.scheduling.policy import GpuSlot, RunningClaim
from gpusched.scheduling.policy_inputs import time_left


def node_key(node: str, uuid: str) -> str:
    return f"{node}/{uuid}"


def split_key(key: str) -> tuple[str, str]:
    node, _, uuid = key.partition("/")
    return node, uuid


def node_report(
    gpus: Sequence[GpuState],
    usage: Mapping[int, Mapping[str, int]],
    util: Mapping[str, float | None],
    reports: Sequence[GpuReport],
    missing_users: Iterable[str],
) -> dict[str, Any]:
    """What an agent writes in its node's row each pass (JSON)."""
    return {
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "total_bytes": g.total_bytes,
                "used_bytes": g.used_bytes,
                "free_bytes": g.free_bytes,
                "util_percent": g.util_percent,
                "health": str(g.health),
                "error": g.error,
                "util": util.get(g.uuid),
            }
            for g in gpus
        ],
        "usage": {str(job): dict(by_gpu) for job, by_gpu in usage.items()},
        "reports": [r.to_json() for r in reports],
        "missing_users": sorted(set(missing_users)),
    }


@dataclass(frozen=True)
class NodeView:
    """A live node as its last report shows it."""

    name: str
    accepts_jobs: bool  # up (not drained)
    gpus: tuple[GpuState, ...]
    util: Mapping[str, float | None]
    usage: Mapping[int, Mapping[str, int]]
    missing_users: frozenset[str]

    @classmethod
    def from_report(cls, name: str, accepts_jobs: bool, report: Mapping[str, Any]) -> NodeView:
        gpus = tuple(
            GpuState(
                g["index"],
                g["uuid"],
                g["name"],
                g["total_bytes"],
                g["used_bytes"],
                g["free_bytes"],
                g.get("util_percent"),
                GpuHealth(g.get("health", "ok")),
                (),
                g.get("error"),
            )
            for g in report.get("gpus", [])
        )
        return cls(
            name,
            accepts_jobs,
            gpus,
            {g["uuid"]: g.get("util") for g in report.get("gpus", [])},
            {int(job): dict(by_gpu) for job, by_gpu in report.get("usage", {}).items()},
            frozenset(report.get("missing_users", [])),
        )


def cluster_slots(nodes: Sequence[NodeView]) -> list[GpuSlot]:
    """Every live node's GPUs; a drained node's are in the table (its jobs' claims) but
    take no new job."""
    return [
        GpuSlot(
            node_key(n.name, g.uuid),
            g.index,
            g.total_bytes,
            g.free_bytes,
            usable=g.health == GpuHealth.OK and n.accepts_jobs,
            util_percent=n.util.get(g.uuid),
            node=n.name,
        )
        for n in nodes
        for g in n.gpus
    ]


def cluster_claims(
    jobs: Sequence[Job],
    nodes: Sequence[NodeView],
    demand_of: Callable[[Job], float | None] = lambda job: None,
    now: datetime | None = None,
) -> list[RunningClaim]:
    """The claims of jobs running or placed on live nodes (placed: nothing used yet), with
    each one's GPU demand (`demand_of`: policy rule 3), and what one server's claims say
    too: `--exclusive`, `--share` (an interactive job is light until measured), the peak
    seen, and what is left of its `--time` at `now` (the head's claim, time backfill)."""
    by_name = {n.name: n for n in nodes}
    claims = []
    for job in jobs:
        node = by_name.get(job.node or "")
        if node is None:
            continue
        used = node.usage.get(job.id, {})
        claims.append(
            RunningClaim(
                job.id,
                tuple(node_key(node.name, u) for u in job.gpu_uuids),
                job.mem,
                {node_key(node.name, u): b for u, b in used.items()},
                job.user,
                job.array_id,
                demand=demand_of(job),
                ends_in_s=_time_left(job, now),
                exclusive=job.exclusive,
                share=job.share or job.interactive,
                peak_bytes=job.peak_mem or 0,
            )
        )
    return claims


def _time_left(job: Job, now: datetime | None) -> float | None:
    """What is left of its --time: a job placed but not started yet has all of it."""
    if job.started_at is None and now is not None:
        return job.time_limit_s
    return time_left(job, now)


def allowed_keys(
    user: str, allowed_nodes: Sequence[str] | None, nodes: Sequence[NodeView]
) -> tuple[frozenset[str] | None, str | None]:
    """The GPU keys a user's job may use (None: any), or why it can go nowhere."""
    fit = [
        n
        for n in nodes
        if (allowed_nodes is None or n.name in allowed_nodes) and user not in n.missing_users
    ]
    if fit and not any(n.accepts_jobs for n in fit):
        return frozenset(), f"node {', '.join(n.name for n in fit)} drained"
    if len(fit) == len(nodes):
        return None, None
    if not fit:
        lacking = sorted(n.name for n in nodes if user in n.missing_users)
        if allowed_nodes is not None and not any(n.name in allowed_nodes for n in nodes):
            return frozenset(), f"none of its nodes ({', '.join(allowed_nodes)}) is up"
        return frozenset(), f"user {user} does not exist on node {', '.join(lacking)}"
    return frozenset(node_key(n.name, g.uuid) for n in fit for g in n.gpus), None
