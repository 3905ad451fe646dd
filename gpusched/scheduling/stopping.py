"""Stopping running jobs for a reason of the daemon's or a user's: the stop intent is
recorded first (read at the job's end, which says why), then this server's supervisor is
asked, or the interactive job's client. A job on another node (cluster) is stopped by
that node's agent, which polls for the intent. Also the pass's response to memory
overruns (`overrun: warn` or `kill`).
"""

from __future__ import annotations

import logging

from gpusched.core.clock import iso
from gpusched.core.models import Job, StopIntent
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.interactive import InteractiveJobs
from gpusched.usage.joblog import append_note
from gpusched.usage.monitor import Overrun

log = logging.getLogger("gpusched.scheduler")


def stop_local(context: Context, endings: JobEndings, job: Job) -> None:
    """Ask this server's supervisor of a running job to stop it (its intent is set)."""
    start_time = context.store.jobs.launch_info(job.id).pid_start_time
    if job.pid is None or not context.launcher.cancel(job.pid, start_time):
        endings.settle(job.id, Outcome(OutcomeKind.CANCELLED))


def stop_job(
    context: Context,
    endings: JobEndings,
    interactive: InteractiveJobs,
    job: Job,
    *,
    intent: StopIntent,
    detail: str,
) -> None:
    """Ask a running job to stop, recording why first (read at its end)."""
    if job.interactive:  # no supervisor: its client stops its command
        interactive.stop(job, intent, detail)
        return
    context.store.jobs.set_stop_intent(job.id, intent, detail)
    if endings.node.owns(job):
        stop_local(context, endings, job)


def act_on_overruns(
    context: Context, endings: JobEndings, interactive: InteractiveJobs, overruns: list[Overrun]
) -> None:
    """Record each job over its declared memory; stop it with `overrun: kill`."""
    if not overruns:
        return
    now = iso(context.clock())
    kill = context.config.overrun == "kill"
    for overrun in overruns:
        job = overrun.job
        hint = overrun.hint()
        context.store.usage.set_usage(job.id, overrun_at=now, hints=[hint] if hint else [])
        what = overrun.describe()
        action = ": stopping it (overrun: kill)" if kill else ": it puts its neighbours at risk"
        log.warning("%s%s", what, action)
        append_note(job.log_path, job.uid, what + action)
        if kill:
            stop_job(context, endings, interactive, job, intent=StopIntent.OVERRUN, detail=what)
