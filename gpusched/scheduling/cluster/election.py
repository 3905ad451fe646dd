"""Who schedules, and whether a node may still start jobs: the pure decisions.

`scheduler_role` decides, from the election's lease row as read, whether this daemon
renews its lease, tries to take it, or follows. `fence_margin` is the margin on both
sides of a node's lease: the node launches nothing past its lease less the margin (its
launch deadline, cluster.node), and the scheduler declares it down only once its lease
plus the margin has passed, so that no job it starts can be one the cluster has already
given to another node. The database's conditions are the
truth (store.placements); these decide only what is worth trying. `may_declare_down`
keeps a scheduler that has just come back (or just started) from declaring down the
nodes that are coming back with it.
"""

from __future__ import annotations

from enum import Enum

from gpusched.store import LeaseRow


class Role(Enum):
    RENEW = "renew"  # we hold the lease: renew it, then schedule
    TAKE = "take"  # no holder, or it expired: try to become the scheduler
    FOLLOW = "follow"  # another daemon schedules


def scheduler_role(lease: LeaseRow | None, me: str, my_epoch: int | None) -> Role:
    if lease is None:
        return Role.TAKE
    if lease.holder == me and lease.epoch == my_epoch:
        return Role.RENEW
    if lease.expired or lease.holder == me:  # ours from a past run: take it back at once
        return Role.TAKE
    return Role.FOLLOW


def fence_margin(node_timeout_s: float, poll_interval_s: float) -> float:
    """How long before its lease runs out a node stops launching jobs, and how long after
    it the scheduler waits before declaring the node down: a third of the timeout, and at
    least two polls (a renewal that is late by a pass must not be too late)."""
    return max(node_timeout_s / 3, 2 * poll_interval_s)


def may_declare_down(steady_for_s: float, node_timeout_s: float) -> bool:
    """Whether the scheduler may declare nodes down: only once it has itself renewed its
    lease without a gap for node_timeout. After the database was away (or this daemon
    paused, or just started) every lease has run out, and the other nodes need a pass
    or two to renew theirs: declared down meanwhile, their running jobs would be lost."""
    return steady_for_s >= node_timeout_s
