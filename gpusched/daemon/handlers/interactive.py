"""Requests of interactive jobs (`gpusched run`, `gpusched.claim()`): `run` queues one for
the calling process, `placement` waits until it is placed, `run_ended` reports its end.

The client process is the job, known by the socket's peer credentials (its pid, and its
start time read here): never by a pid in the request. Only that very process may wait
for the placement and report the end; anyone else acts on it as on any job (`cancel`,
`status`). The daemon launches nothing for it, so it stores no environment.
"""

from __future__ import annotations

import os

from gpusched.core.errors import ConflictError, PermissionDenied, UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.requests.catalog import PlacementRequest, RunEndedRequest, RunRequest
from gpusched.core.requests.replies import JobJson, PlacementReply
from gpusched.core.units import format_duration
from gpusched.daemon.bounds import check_submit
from gpusched.daemon.handlers.jobs import host_ask_checked
from gpusched.daemon.identity import Caller, account_gid
from gpusched.daemon.services import Services
from gpusched.processes.environment import gpu_environment, sharing_environment
from gpusched.processes.pidref import process_start_time
from gpusched.store import NewJob

MAX_PLACEMENT_WAIT_S = 30.0  # one `placement` request; the client asks again


def run(services: Services, caller: Caller, request: RunRequest) -> JobJson:
    settings = services.config.interactive
    if settings.max_per_user == 0:
        raise UsageError("interactive jobs are switched off here (interactive.max_per_user 0)")
    time_limit = request.time if request.time is not None else settings.default_time_s
    if settings.max_time_s is not None and time_limit is not None:
        if time_limit > settings.max_time_s:
            most = format_duration(settings.max_time_s, exact=True)
            raise UsageError(f"--time is at most {most} here (interactive.max_time)")
    elif settings.max_time_s is not None:
        time_limit = settings.max_time_s
    start_time = _client_start_time(caller)
    command = list(request.command)
    new = NewJob(
        user=caller.user,
        uid=caller.uid,
        gid=account_gid(caller),
        command=command,
        cwd=request.cwd,
        env={},
        umask=0o022,
        mem=request.mem,
        gpus=request.gpus,
        name=request.name,
        priority=request.priority,
        time_limit_s=time_limit,
        client_pid=caller.pid,
        client_start_time=start_time,
        exclusive=request.exclusive,
        share=request.share,
        ram=request.ram,
        cpus=request.cpus,
        # Its client is its process here: in a cluster, only this server may run it.
        allowed_nodes=(services.scheduler.node_name,) if services.scheduler.in_cluster else None,
    )
    check_submit(services.config, command, None, request.name, ())
    if request.ram is not None or request.cpus is not None:
        host_ask_checked(services, caller.user, request.ram, request.cpus)
    return services.visible(caller, services.scheduler.submit(new))


def placement(services: Services, caller: Caller, request: PlacementRequest) -> PlacementReply:
    """{"job": JOB, "env": ..., "env_defaults": ..., "kill_grace_s": ...} once it runs; until
    then (or after `timeout` seconds) {"job": JOB} with its waiting reason."""
    job = _clients_job(services, caller, request.id)
    timeout = MAX_PLACEMENT_WAIT_S if request.timeout is None else request.timeout
    job = services.scheduler.interactive.wait_placed(
        job.id, min(max(timeout, 0.0), MAX_PLACEMENT_WAIT_S)
    )
    reply: PlacementReply = {"job": services.visible(caller, job)}
    if job.state == JobState.RUNNING:
        config = services.config
        gpus = services.scheduler.current_gpus()
        totals = [g.total_bytes for g in gpus if g.uuid in job.gpu_uuids]
        # Fenced off the other cards (as a batch job is): CUDA may number only its own,
        # so the UUIDs name its cards where indices could name another or none.
        fenced = services.scheduler.context.launcher.fences_devices
        reply["env"] = gpu_environment(
            job.id, job.gpu_indices, job.gpu_uuids, "uuid" if fenced else config.visible_devices
        )
        reply["env_defaults"] = sharing_environment(job.mem, totals, {})  # unless set already
        reply["kill_grace_s"] = config.kill_grace_s
    return reply


def run_ended(services: Services, caller: Caller, request: RunEndedRequest) -> JobJson:
    """The client's command ended: killed by `signal`, else with `exit_code`."""
    job = _clients_job(services, caller, request.id)
    exit_code = None if request.signal is not None else request.exit_code
    ended = services.scheduler.interactive.finish(job, exit_code, request.signal)
    return services.visible(caller, ended)


def _client_start_time(caller: Caller) -> str:
    """The start time of the calling process, which must be the caller's own."""
    if caller.pid <= 0:
        raise ConflictError("cannot tell which process is asking (the socket gave no pid)")
    try:
        owner = os.stat(f"/proc/{caller.pid}").st_uid
    except OSError:
        owner = None
    start_time = process_start_time(caller.pid)
    if start_time is None or owner != caller.uid:
        raise ConflictError(f"the asking process (pid {caller.pid}) is gone")
    return start_time


def _clients_job(services: Services, caller: Caller, ident: int) -> Job:
    """The interactive job that the calling process itself queued."""
    job = services.owned_job(caller, ident)
    if not job.interactive:
        raise UsageError(f"job {ident} is not an interactive job (gpusched run, claim())")
    info = services.store.jobs.launch_info(job.id)
    if (
        job.uid != caller.uid
        or job.pid != caller.pid
        or process_start_time(caller.pid) != info.pid_start_time
    ):
        raise PermissionDenied(
            f"job {ident} belongs to another process: only the `gpusched run` or claim()"
            " that queued it can wait for it or end it (`gpusched cancel` ends it)"
        )
    return job
