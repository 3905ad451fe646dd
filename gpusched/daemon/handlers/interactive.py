"""Requests of interactive jobs (`gpusched run`, `gpusched.claim()`): `run` queues one for
the calling process, `placement` waits until it is placed, `run_ended` reports its end.

The client process is the job, known by the socket's peer credentials (its pid, and its
start time read here): never by a pid in the request. Only that very process may wait
for the placement and report the end; anyone else acts on it as on any job (`cancel`,
`status`). The daemon launches nothing for it, so it stores no environment.
"""

from __future__ import annotations

import os
from typing import Any

from gpusched.core.errors import ConflictError, PermissionDenied, UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.units import format_duration
from gpusched.daemon.bounds import MAX_NAME_CHARS, check_submit
from gpusched.daemon.handlers.args import arg, job_id, str_list
from gpusched.daemon.identity import Caller, account_gid
from gpusched.daemon.services import Services
from gpusched.processes.environment import gpu_environment, sharing_environment
from gpusched.processes.pidref import process_start_time
from gpusched.store import NewJob

MAX_PLACEMENT_WAIT_S = 30.0  # one `placement` request; the client asks again


def run(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    settings = services.config.interactive
    if settings.max_per_user == 0:
        raise UsageError("interactive jobs are switched off here (interactive.max_per_user 0)")
    command = str_list(args, "command")
    if not command or not command[0]:
        raise UsageError("no command given: gpusched run [OPTIONS] -- COMMAND [ARGS...]")
    cwd = arg(args, "cwd", str, required=True)
    if not os.path.isabs(cwd):
        raise UsageError(f"working directory must be an absolute path, not {cwd!r}")
    mem = arg(args, "mem", int)
    if mem is not None and mem <= 0:
        raise UsageError("--mem must be more than zero")
    gpus = arg(args, "gpus", int, default=1)
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    name = arg(args, "name", str)
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise UsageError(f"--name is limited to {MAX_NAME_CHARS} characters")
    time_limit = arg(args, "time", (int, float))
    if time_limit is not None and not 0 < time_limit < 10**9:
        raise UsageError("--time must be more than zero")
    if time_limit is None:
        time_limit = settings.default_time_s
    if settings.max_time_s is not None and time_limit is not None:
        if time_limit > settings.max_time_s:
            most = format_duration(settings.max_time_s, exact=True)
            raise UsageError(f"--time is at most {most} here (interactive.max_time)")
    elif settings.max_time_s is not None:
        time_limit = settings.max_time_s
    start_time = _client_start_time(caller)
    new = NewJob(
        user=caller.user,
        uid=caller.uid,
        gid=account_gid(caller),
        command=command,
        cwd=cwd,
        env={},
        umask=0o022,
        mem=mem,
        gpus=gpus,
        name=name,
        priority=arg(args, "priority", int, default=0),
        time_limit_s=None if time_limit is None else float(time_limit),
        client_pid=caller.pid,
        client_start_time=start_time,
    )
    check_submit(services.config, command, None, name, ())
    return services.visible(caller, services.scheduler.submit(new))


def placement(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    """{"job": JOB, "env": ..., "env_defaults": ..., "kill_grace_s": ...} once it runs; until
    then (or after `timeout` seconds) {"job": JOB} with its waiting reason."""
    job = _clients_job(services, caller, job_id(args))
    timeout = float(arg(args, "timeout", (int, float), default=MAX_PLACEMENT_WAIT_S))
    job = services.scheduler.interactive.wait_placed(
        job.id, min(max(timeout, 0.0), MAX_PLACEMENT_WAIT_S)
    )
    reply: dict[str, Any] = {"job": services.visible(caller, job)}
    if job.state == JobState.RUNNING:
        config = services.config
        gpus = services.scheduler.current_gpus()
        totals = [g.total_bytes for g in gpus if g.uuid in job.gpu_uuids]
        reply["env"] = gpu_environment(
            job.id, job.gpu_indices, job.gpu_uuids, config.visible_devices
        )
        reply["env_defaults"] = sharing_environment(job.mem, totals, {})  # unless set already
        reply["kill_grace_s"] = config.kill_grace_s
    return reply


def run_ended(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    """The client's command ended: with `exit_code`, or killed by `signal`."""
    job = _clients_job(services, caller, job_id(args))
    exit_code = arg(args, "exit_code", int)
    signum = arg(args, "signal", int)
    if (exit_code is None) == (signum is None):
        raise UsageError("say how the command ended: an exit_code or a signal")
    if exit_code is not None and not 0 <= exit_code <= 255:
        raise UsageError("exit_code must be between 0 and 255")
    if signum is not None and not 1 <= signum <= 64:
        raise UsageError("signal must be between 1 and 64")
    return services.visible(caller, services.scheduler.finish_interactive(job, exit_code, signum))


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
    info = services.store.launch_info(job.id)
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
