"""A node's `running` rows that it does not hold as the database does, made whole while
the node stays live.

A write whose COMMIT the database applied but whose answer never came back (a partition
or a reset at that instant; the wait bound, gpusched.store.waits, then fails the pass
there) leaves the node believing it undone:
- a claim (store.placements.mark_running_placed): the row is `running` on this node,
  nothing was launched, and the node does not count the job as its own
  (`ClusterNode.local`);
- a launch's pid write: the supervisor runs, the node does not count it either;
- a take-back or a revival after the node was declared down (store.attempts
  take_back_requeued, store.placements.revive_lost): the row is `running` here under the
  node's new epoch, the node keeps the run under the old one, and the run's end, written
  under that epoch, is refused.
Nobody else ends such a row while the node renews its lease (only declaring it down
would), and only a restart's adoption (scheduling.adoption) would look at it: the job would stay
`running` for good. Each pass of the agent settles them as adoption does.
"""

from __future__ import annotations

import logging
import os

from gpusched.core.models import Job, JobState
from gpusched.processes.launching import OutcomeKind
from gpusched.scheduling.cluster.node import ClusterNode
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.store import NodeGuard

log = logging.getLogger("gpusched.cluster")


def own_strays(
    context: Context, endings: JobEndings, node: ClusterNode, running: list[Job]
) -> None:
    """Settle this node's running rows (`running`, as the pass read them) that it does not
    hold as the database does (under the pass's lock, before the node starts anything, so
    no launch of its own is half way). Read again only if one is missing from
    `node.local` or held there under an epoch older than the node's (rare: after a lost
    answer). A run held under another epoch than its row's, same pid, takes the row's.
    One not held at all: a supervisor that runs is recorded (launched, and watched, in
    this daemon's life: a restart's are adopted at start); a claim that launched nothing
    (no supervisor, no exit record, no log) goes back to the queue; any other ends as its
    exit record says (lost if none). Interactive jobs are left to their clients' check
    (scheduling.interactive)."""
    local = node.local
    doubtful = [
        j
        for j in running
        if not j.interactive and (j.id not in local or local[j.id][0] != node.epoch)
    ]
    if not doubtful:
        return
    rows = context.store.placements.rows_of([j.id for j in doubtful])
    for job in doubtful:
        state, where, epoch = rows.get(job.id, (None, None, None))
        if state != JobState.RUNNING or where != node.name or epoch is None:
            continue  # changed since the pass read it (declared down, ended): not ours now
        held = local.get(job.id)
        if held is None:
            _settle_unheld(context, endings, node, job, epoch)
        elif held[0] != epoch and held[1] == job.pid:
            local[job.id] = (epoch, held[1], held[2])
            log.warning("job %s runs here under epoch %s: its end is written so", job.id, epoch)


def _settle_unheld(
    context: Context, endings: JobEndings, node: ClusterNode, job: Job, epoch: int
) -> None:
    launcher, placements = context.launcher, context.store.placements
    guard = NodeGuard(node.name, epoch)
    pid = job.pid if job.pid is not None else launcher.find_supervisor(job.id)
    began = launcher.start_time(pid) if pid is not None else None
    if pid is not None and began is not None and launcher.is_running(pid, began):
        if job.pid is None:
            placements.launched(job.id, guard, pid, began)
        node.local[job.id] = (epoch, pid, began)
        log.warning("job %s runs here (pid %s) but was not counted here: it is now", job.id, pid)
        return
    outcome = launcher.outcome(job.id)
    never_ran = (
        outcome.kind == OutcomeKind.LOST
        and job.pid is None
        and not (job.log_path and os.path.lexists(job.log_path))
    )
    if never_ran and placements.unclaim(job.id, guard):
        log.warning("job %s was claimed here but never launched: queued again", job.id)
        return
    log.warning("job %s is running here by the database, with no process: ended", job.id)
    endings.settle(job.id, outcome)
