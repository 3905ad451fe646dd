"""A node's `running` rows that it does not know it runs, made whole while it stays live.

A claim (store.placements.mark_running_placed) or a launch's pid write whose COMMIT the
database applied but whose answer never came back (a partition or a reset at that
instant; the wait bound, gpusched.store.waits, then fails the pass there) leaves a row
`running` on this node that the node does not count as its own (`ClusterNode.local`):
a claim that launched nothing, or a supervisor whose pid the row may lack. Nobody else
ends such a row while the node renews its lease (only declaring it down would), and a
restart's adoption (scheduling.adoption) is the only other place that looks: before
this, the job stayed `running` for good, never launched (issue 26's stall in the
randomized fault rounds). Each pass of the agent settles them as adoption does.
"""

from __future__ import annotations

import logging
import os

from gpusched.core.models import Job
from gpusched.processes.launching import OutcomeKind
from gpusched.scheduling.cluster.node import ClusterNode
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.store import NodeGuard

log = logging.getLogger("gpusched.cluster")


def own_strays(
    context: Context, endings: JobEndings, node: ClusterNode, running: list[Job]
) -> None:
    """Settle this node's running rows missing from `node.local` (under the pass's lock,
    before the node starts anything, so no launch of its own is half way): a supervisor
    that runs is recorded (launched, and watched, in this daemon's life: a restart's are
    adopted at start); a claim that launched nothing (no supervisor, no exit record, no
    log) goes back to the queue; any other ends as its exit record says (lost if none).
    Interactive jobs are left to their clients' check (scheduling.interactive)."""
    strays = [j for j in running if j.id not in node.local and not j.interactive]
    if not strays:
        return
    launcher, placements = context.launcher, context.store.placements
    rows = placements.rows_of([j.id for j in strays])
    for job in strays:
        state, where, epoch = rows.get(job.id, (None, None, None))
        if state != job.state or where != node.name:
            continue  # changed since the pass read it (declared down, ended): not ours now
        guard = NodeGuard(node.name, node.epoch if epoch is None else epoch)
        pid = job.pid if job.pid is not None else launcher.find_supervisor(job.id)
        began = launcher.start_time(pid) if pid is not None else None
        if pid is not None and began is not None and launcher.is_running(pid, began):
            if job.pid is None:
                placements.launched(job.id, guard, pid, began)
            node.local[job.id] = (guard.epoch, pid, began)
            log.warning(
                "job %s runs here (pid %s) but was not counted here: it is now", job.id, pid
            )
            continue
        outcome = launcher.outcome(job.id)
        never_ran = (
            outcome.kind == OutcomeKind.LOST
            and job.pid is None
            and not (job.log_path and os.path.lexists(job.log_path))
        )
        if never_ran and placements.unclaim(job.id, guard):
            log.warning("job %s was claimed here but never launched: queued again", job.id)
            continue
        log.warning("job %s is running here by the database, with no process: ended", job.id)
        endings.settle(job.id, outcome)
