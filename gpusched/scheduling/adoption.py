"""What a restarted daemon makes of the jobs it finds `running`: a claim to verify.

`adopt` runs once, when the daemon starts (Scheduler.adopt_running), under the context's
lock as every ending is. Each of this daemon's running rows (interactive ones aside:
their client is checked at every pass) is re-adopted if its supervisor still runs,
queued again if the command provably never started, else settled from its exit record
(or `lost`) by the endings (scheduling.endings), which know nothing of adoption.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from gpusched.core.models import JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.boot import rebooted_since_last_run

if TYPE_CHECKING:
    from gpusched.scheduling.context import Context
    from gpusched.scheduling.endings import JobEndings

log = logging.getLogger("gpusched.scheduler")


def adopt(context: Context, endings: JobEndings) -> None:
    """After a (re)start: a `running` row is a claim to verify, not a fact."""
    rebooted = rebooted_since_last_run(context.config.state_dir)
    with context.lock:
        _verify(endings, rebooted)


def _verify(endings: JobEndings, rebooted: bool) -> None:
    """Verify each of this daemon's running rows (`rebooted`: since the last run)."""
    for job in endings.jobs.active():
        if job.state != JobState.RUNNING or not endings.node.owns(job):
            continue
        if job.interactive:  # its client is checked at every pass (interactive.py)
            continue
        info = endings.jobs.launch_info(job.id)
        pid, start_time = job.pid, info.pid_start_time
        if pid is None:
            # The previous daemon died between marking and recording the pid.
            pid = endings.launcher.find_supervisor(job.id)
            start_time = endings.launcher.start_time(pid) if pid is not None else None
            if pid is not None and start_time is not None:
                endings.jobs.set_pid(job.id, pid, start_time)
        if pid is not None and endings.launcher.is_running(pid, start_time):
            log.info("job %s still running (pid %s): re-adopted", job.id, pid)
            endings.launcher.watch(job.id, pid, start_time)
            endings.node.started(job.id, pid, start_time)
            endings.probe.note_job_started(pid, job.gpu_uuids, job.mem, info.env)
        else:
            outcome = endings.launcher.outcome(job.id)
            # Died between marking the job running and its supervisor opening the
            # log (no pid, no supervisor, no exit record, no log): the command never
            # ran, so running it now cannot run it twice. Not after a reboot: the
            # log's creation (and the pid, see Store) may have been lost with the
            # page cache, so its absence proves nothing.
            if (
                outcome.kind == OutcomeKind.LOST
                and pid is None
                and not rebooted
                and not (job.log_path and os.path.lexists(job.log_path))
                and endings.jobs.unmark_running(job.id)
            ):
                log.info("job %s never started before the restart: queued again", job.id)
                continue
            if outcome.kind == OutcomeKind.LOST:
                outcome = Outcome(
                    OutcomeKind.LOST,
                    message="its supervisor was gone when the daemon"
                    " restarted, with no exit status recorded",
                )
            endings.settle(job.id, outcome)
