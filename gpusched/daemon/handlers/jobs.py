"""Requests that change jobs: `submit` (one job or a sweep's array), `requeue`,
`priority`, `hold`, `release` and `cancel`. Each acts only on a job `services.owned_job`
lets the caller touch, and answers with the jobs as `services.visible` shows them."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gpusched.core.errors import ConflictError, NotFoundError, ProtocolError, UsageError
from gpusched.core.models import TERMINAL_STATES, Job, JobState
from gpusched.core.sweep import expand, swept_name
from gpusched.daemon.bounds import MAX_NAME_CHARS, check_env, check_submit
from gpusched.daemon.handlers.args import (
    arg,
    int_list,
    job_id,
    notify,
    retry_oom,
    str_list,
    text,
)
from gpusched.daemon.handlers.views import job_list
from gpusched.daemon.identity import Caller, account_gid, can_enter
from gpusched.daemon.services import Services
from gpusched.store import NewJob


def submit(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    config = services.config
    command = str_list(args, "command")
    if not command or not command[0]:
        raise UsageError("no command given: gpusched submit [OPTIONS] -- COMMAND [ARGS...]")
    cwd = arg(args, "cwd", str, required=True)
    if not os.path.isabs(cwd):
        raise UsageError(f"working directory must be an absolute path, not {cwd!r}")
    if caller.uid != 0:
        problem = can_enter(caller.uid, account_gid(caller), cwd)
        if problem is not None:
            raise UsageError(problem)
    env = arg(args, "env", dict, default={})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("'env' must map strings to strings")
    check_env(env, config)
    mem = arg(args, "mem", int)
    if mem is not None and mem <= 0:
        raise UsageError("--mem must be more than zero")
    gpus = arg(args, "gpus", int, default=1)
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    umask = arg(args, "umask", int, default=0o022)
    if not 0 <= umask <= 0o777:
        raise ProtocolError("'umask' must be between 0 and 0o777")
    name = arg(args, "name", str)
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise UsageError(f"--name is limited to {MAX_NAME_CHARS} characters")
    time_limit = arg(args, "time", (int, float))
    if time_limit is not None and not 0 < time_limit < 10**9:
        raise UsageError("--time must be more than zero")
    max_concurrent = arg(args, "max_concurrent", int)
    if max_concurrent is not None and max_concurrent < 1:
        raise UsageError("--max-concurrent must be at least 1")
    new = NewJob(
        user=caller.user,
        uid=caller.uid,
        gid=account_gid(caller),
        command=command,
        cwd=cwd,
        env=env,
        umask=umask,
        mem=mem,
        gpus=gpus,
        name=name,
        priority=arg(args, "priority", int, default=0),
        after=tuple(int_list(args, "after")),
        held=bool(arg(args, "hold", bool, default=False)),
        time_limit_s=None if time_limit is None else float(time_limit),
        max_concurrent=max_concurrent,
        notify=notify(args),
        retry_oom=retry_oom(args),
    )
    sweep = arg(args, "sweep", list)
    if sweep is None:
        if max_concurrent is not None:
            raise UsageError("--max-concurrent applies to a --sweep array")
        check_submit(config, command, None, name, new.after)
        return services.visible(caller, services.scheduler.submit(new))
    pairs = []
    for item in sweep:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(v, str) for v in item[1])
        ):
            raise ProtocolError("'sweep' must be a list of [name, [values...]]")
        pairs.append((item[0], item[1]))
    check_submit(config, command, pairs, name, new.after)  # before expanding
    news = [
        replace(new, command=argv, name=swept_name(name, text(label), MAX_NAME_CHARS))
        for argv, label in expand(command, pairs, config.max_array_jobs)
    ]
    jobs = services.scheduler.submit_many(news, as_array=True)
    return [services.visible(caller, job) for job in jobs]


def priority(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    job = services.owned_job(caller, job_id(args))
    value = arg(args, "priority", int, required=True)
    return services.visible(caller, services.scheduler.set_priority(job, value))


def requeue(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    """A new job with the same spec as an ended one (its dependencies are not carried over).

    An OOM retry's memory is the grown one, and `--retry-oom` is the count the user first
    gave (the first attempt's), not what the retries left of it.
    """
    old = services.owned_job(caller, job_id(args))
    if old.state not in TERMINAL_STATES:
        raise ConflictError(f"job {old.id} is {old.state}: only an ended job can be requeued")
    if old.interactive:  # it ran in its caller's terminal, with an environment never stored
        raise ConflictError(
            f"job {old.id} was interactive (gpusched run, claim()): run it again the same way"
        )
    info = services.store.launch_info(old.id)
    first = old if old.retry_of is None else services.store.get(old.retry_of)
    new = NewJob(
        user=old.user,
        uid=old.uid,
        gid=info.gid,
        command=old.command,
        cwd=old.cwd,
        env=info.env,
        umask=info.umask,
        mem=old.mem,
        gpus=old.gpus,
        # A swept job's name carries its sweep values; out of its array, nothing would
        # hide them from other users (the command, which holds them, still shows to you).
        name=old.name if old.array_id is None else None,
        priority=old.priority,
        time_limit_s=old.time_limit_s,
        retry_oom=first.retry_oom or 0,
        notify=tuple(old.notify) if old.notify else None,  # the same `--notify` hook
    )
    return services.visible(caller, services.scheduler.submit(new))


def hold(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    job = services.owned_job(caller, job_id(args))
    return services.visible(caller, services.scheduler.hold(job))


def release(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    job = services.owned_job(caller, job_id(args))
    return services.visible(caller, services.scheduler.release(job))


def cancel(services: Services, caller: Caller, args: dict[str, Any]) -> Any:
    if arg(args, "mine", bool, default=False):
        return _cancel_mine(services, caller, arg(args, "waiting_only", bool, default=False))
    if args.get("array") is not None:
        return _cancel_array(services, caller, arg(args, "array", int))
    job = services.owned_job(caller, job_id(args))
    return services.visible(caller, services.scheduler.cancel(job, by=caller.user))


def _cancel_mine(services: Services, caller: Caller, waiting_only: bool) -> Any:
    """Every active job of the caller's own (root's and admins' too: others' only by id)."""
    ids = services.scheduler.cancel_waiting(caller.uid, caller.user)
    running = [] if waiting_only else [j for j in services.store.running() if j.uid == caller.uid]
    return _cancelled(services, caller, ids, running, waiting_only)


def _cancel_array(services: Services, caller: Caller, array_id: int) -> Any:
    """The array's waiting jobs in one transaction, then its running ones one by one."""
    everything = services.store.array_jobs(array_id)
    if not everything:
        raise NotFoundError(f"no array a{array_id}")
    owner = services.owned_job(caller, everything[0].id)  # one submit: one owner
    ids = services.scheduler.cancel_waiting(owner.uid, caller.user, array_id=array_id)
    running = [j for j in everything if j.state == JobState.RUNNING]
    return _cancelled(services, caller, ids, running, waiting_only=False)


def _cancelled(
    services: Services, caller: Caller, ids: list[int], running: list[Job], waiting_only: bool
) -> list[dict[str, Any]]:
    """The jobs cancelled at once (`ids`), then `running` cancelled one by one."""
    for job in running:
        try:
            ids.append(services.scheduler.cancel(job, caller.user, waiting_only).id)
        except ConflictError:  # it ended (or, with waiting_only, started) meanwhile
            continue
    return job_list(services, caller, ids, done=f"{len(ids)} jobs cancelled")
