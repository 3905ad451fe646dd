"""The daemon's request handlers: one function per request and the flat table (HANDLERS)
that dispatches to them.

A handler gets the server (its scheduler, store, config and the authorization rules
`owned_job` and `visible`), the caller and the request's arguments; it checks every
argument it reads, returns a JSON-able value and never touches the socket: server.py
reads the request, identifies the caller, picks the handler and writes the reply.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpusched import __version__
from gpusched.core.clock import iso, utc_now
from gpusched.core.errors import (
    ConflictError,
    GpuschedError,
    NotFoundError,
    PermissionDenied,
    ProtocolError,
    UsageError,
)
from gpusched.core.hints import suggest_mem
from gpusched.core.logcap import read_log
from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES, Drain, Job, JobState
from gpusched.core.sweep import expand, swept_name
from gpusched.daemon.bounds import (
    MAX_NAME_CHARS,
    REPLY_BUDGET,
    check_env,
    check_ids,
    check_submit,
    reply_weight,
)
from gpusched.daemon.identity import Caller, account_gid, can_enter, user_name
from gpusched.store import NewJob

if TYPE_CHECKING:
    from gpusched.daemon.server import Server

MAX_WAIT_S = 30.0
MAX_LOG_CHUNK = 1 << 20
MAX_RETRY_OOM = 10
MAX_REASON_CHARS = 500  # a drain reason is shown on every `status`

Handler = Callable[["Server", Caller, dict[str, Any]], Any]


# -- argument checks: a wrong type is the client's fault, never the daemon's crash ----------


def _arg(
    args: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    default: Any = None,
    required: bool = False,
) -> Any:
    if key not in args or args[key] is None:
        if required:
            raise ProtocolError(f"request is missing '{key}'")
        return default
    value = args[key]
    if isinstance(value, bool) and kind is int:
        raise ProtocolError(f"'{key}' must be an integer")
    if not isinstance(value, kind):
        raise ProtocolError(f"'{key}' has the wrong type")
    _check_value(key, value)
    return value


def _check_value(key: str, value: Any) -> None:
    """What the JSON type allows but the database and the OS cannot hold."""
    if _holds_nul(value):
        # No path, argument, environment entry or name can hold one (the OS ends a C
        # string there); refused here, for every request, rather than deep in a stat().
        raise UsageError(f"'{key}' contains a NUL character (\\x00)")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise UsageError(f"'{key}' is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"'{key}' must be a finite number")  # NaN would make `wait` hang
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")  # lone surrogates (PEP 383) fit JSON columns, not text ones
        except UnicodeEncodeError:
            raise UsageError(f"'{key}' is not valid UTF-8 text") from None


def _holds_nul(value: Any) -> bool:
    """A NUL in a string of `value`, its lists or its mappings (keys too), walked without
    recursion (decode() bounds the depth; this need not trust it)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
    return False


def _notify(args: dict[str, Any]) -> tuple[str, ...] | None:
    """`submit --notify`: an argv (the client splits the user's string with shlex)."""
    argv = _str_list(args, "notify")
    if not argv:
        return None
    if not argv[0] or len(argv) > 256 or sum(map(len, argv)) > 16384:
        raise UsageError("--notify: expected a command of reasonable length")
    return tuple(argv)


def _retry_oom(args: dict[str, Any]) -> int:
    retries = _arg(args, "retry_oom", int, default=0)
    if not 0 <= retries <= MAX_RETRY_OOM:
        raise UsageError(f"--retry-oom must be between 0 and {MAX_RETRY_OOM}")
    return int(retries)


def _job_id(args: dict[str, Any]) -> int:
    value = _arg(args, "id", int, required=True)
    if value < 1:
        raise NotFoundError(f"no job {value}")
    return int(value)


def _str_list(args: dict[str, Any], key: str) -> list[str]:
    value = _arg(args, key, list, default=[])
    if not all(isinstance(item, str) for item in value):
        raise ProtocolError(f"'{key}' must be a list of strings")
    return value


def _text(value: str) -> str:
    """For a text column: lone surrogates (undecodable bytes in argv) as \\udcXX escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _int_list(args: dict[str, Any], key: str) -> list[int]:
    """Job ids: each once, at most bounds.MAX_IDS (checked before any is looked up)."""
    value = _arg(args, key, list, default=[])
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise ProtocolError(f"'{key}' must be a list of job ids")
    ids = check_ids(key, value)
    for item in ids:
        _check_value(key, item)
    return ids


# -- handlers: one per request, each returns a JSON-able value ------------------------------------


def _ping(server: Server, caller: Caller, _args: dict[str, Any]) -> Any:
    return {
        "version": __version__,
        "pid": os.getpid(),
        "user": caller.user,  # who is asking, as the daemon sees them (SO_PEERCRED)
        "uid": caller.uid,
        "daemon_user": user_name(os.geteuid()),  # whose daemon this is
        "daemon_uid": os.geteuid(),
        "single_user": server.single_user,
    }


def _submit(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    command = _str_list(args, "command")
    if not command or not command[0]:
        raise UsageError("no command given: gpusched submit [OPTIONS] -- COMMAND [ARGS...]")
    cwd = _arg(args, "cwd", str, required=True)
    if not os.path.isabs(cwd):
        raise UsageError(f"working directory must be an absolute path, not {cwd!r}")
    if caller.uid != 0:
        problem = can_enter(caller.uid, account_gid(caller), cwd)
        if problem is not None:
            raise UsageError(problem)
    env = _arg(args, "env", dict, default={})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("'env' must map strings to strings")
    check_env(env, server.config)
    mem = _arg(args, "mem", int)
    if mem is not None and mem <= 0:
        raise UsageError("--mem must be more than zero")
    gpus = _arg(args, "gpus", int, default=1)
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    umask = _arg(args, "umask", int, default=0o022)
    if not 0 <= umask <= 0o777:
        raise ProtocolError("'umask' must be between 0 and 0o777")
    name = _arg(args, "name", str)
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise UsageError(f"--name is limited to {MAX_NAME_CHARS} characters")
    time_limit = _arg(args, "time", (int, float))
    if time_limit is not None and not 0 < time_limit < 10**9:
        raise UsageError("--time must be more than zero")
    max_concurrent = _arg(args, "max_concurrent", int)
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
        priority=_arg(args, "priority", int, default=0),
        after=tuple(_int_list(args, "after")),
        held=bool(_arg(args, "hold", bool, default=False)),
        time_limit_s=None if time_limit is None else float(time_limit),
        max_concurrent=max_concurrent,
        notify=_notify(args),
        retry_oom=_retry_oom(args),
    )
    sweep = _arg(args, "sweep", list)
    if sweep is None:
        if max_concurrent is not None:
            raise UsageError("--max-concurrent applies to a --sweep array")
        check_submit(server.config, command, None, name, new.after)
        return server.visible(caller, server.scheduler.submit(new))
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
    check_submit(server.config, command, pairs, name, new.after)  # before expanding
    news = [
        replace(new, command=argv, name=swept_name(name, _text(label), MAX_NAME_CHARS))
        for argv, label in expand(command, pairs, server.config.max_array_jobs)
    ]
    jobs = server.scheduler.submit_many(news, as_array=True)
    return [server.visible(caller, job) for job in jobs]


def _priority(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    job = server.owned_job(caller, _job_id(args))
    priority = _arg(args, "priority", int, required=True)
    return server.visible(caller, server.scheduler.set_priority(job, priority))


def _requeue(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    """A new job with the same spec as an ended one (its dependencies are not carried over).

    An OOM retry's memory is the grown one, and `--retry-oom` is the count the user first
    gave (the first attempt's), not what the retries left of it.
    """
    old = server.owned_job(caller, _job_id(args))
    if old.state not in TERMINAL_STATES:
        raise ConflictError(f"job {old.id} is {old.state}: only an ended job can be requeued")
    info = server.store.launch_info(old.id)
    first = old if old.retry_of is None else server.store.get(old.retry_of)
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
    return server.visible(caller, server.scheduler.submit(new))


def _array(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    array_id = _arg(args, "array", int, required=True)
    ids = server.store.array_ids(array_id)
    if not ids:
        raise NotFoundError(f"no array a{array_id}")
    return _job_list(server, caller, ids)


def _job_list(
    server: Server, caller: Caller, ids: list[int], done: str | None = None
) -> list[dict[str, Any]]:
    """The jobs as the caller may see them, read in chunks and refused past REPLY_BUDGET:
    the daemon never holds more of a reply than a client could read. `done`: what the
    request did anyway (the error says so)."""
    shown, size = [], 0
    for job in server.store.iter_jobs(ids):
        data = server.visible(caller, job)
        size += reply_weight(data)
        if size > REPLY_BUDGET:
            too_long = f"more than one reply holds ({REPLY_BUDGET // 2**20} MiB)"
            if done is not None:
                raise GpuschedError(f"{done}, but listing them is {too_long}")
            raise UsageError(f"the answer lists {len(ids)} jobs, {too_long}: ask for fewer")
        shown.append(data)
    return shown


def _cancel_array(server: Server, caller: Caller, array_id: int) -> Any:
    """The array's waiting jobs in one transaction, then its running ones one by one."""
    everything = server.store.array_jobs(array_id)
    if not everything:
        raise NotFoundError(f"no array a{array_id}")
    owner = server.owned_job(caller, everything[0].id)  # one submit: one owner
    ids = server.scheduler.cancel_waiting(owner.uid, caller.user, array_id=array_id)
    running = [j for j in everything if j.state == JobState.RUNNING]
    return _cancelled(server, caller, ids, running, waiting_only=False)


def _cancelled(
    server: Server, caller: Caller, ids: list[int], running: list[Job], waiting_only: bool
) -> list[dict[str, Any]]:
    """The jobs cancelled at once (`ids`), then `running` cancelled one by one."""
    for job in running:
        try:
            ids.append(server.scheduler.cancel(job, caller.user, waiting_only).id)
        except ConflictError:  # it ended (or, with waiting_only, started) meanwhile
            continue
    return _job_list(server, caller, ids, done=f"{len(ids)} jobs cancelled")


def _status(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    """GPUs and one page of active jobs in id order, whatever the queue's length.

    `cursor`: the page after this id (the previous reply's `next`; null at the last
    page); `limit`: jobs per page, at most `status_page_jobs`; `states`: only these
    active states. With `all`, the last page ends with the 20 most recently ended jobs.
    `counts`: how many jobs are in each active state, all pages together.
    """
    page_size = server.config.status_page_jobs
    limit = min(page_size, max(1, _arg(args, "limit", int, default=page_size)))
    cursor = max(0, _arg(args, "cursor", int, default=0))
    states = ACTIVE_STATES
    if args.get("states") is not None:
        names = _str_list(args, "states")
        if not set(names) <= {str(s) for s in ACTIVE_STATES}:
            raise UsageError("'states': only queued, held and running jobs are paged")
        states = frozenset(JobState(name) for name in names)
    page = server.store.active_page(cursor, limit + 1, states)
    more = len(page) > limit
    jobs: list[dict[str, Any]] = []
    size, last = 0, cursor
    for job in server.store.iter_jobs(page[:limit]):
        if jobs and size > REPLY_BUDGET // 2:  # a page of long commands ends early
            more = True
            break
        jobs.append(server.visible(caller, job))
        size += reply_weight(jobs[-1])
        last = job.id
    if not more and _arg(args, "all", bool, default=False):
        jobs += [server.visible(caller, j) for j in server.store.ended(limit=20)]
    return {
        "gpus": [g.to_json() for g in server.scheduler.gpu_reports(server.store.running())],
        "jobs": jobs,
        "drain": _drain_json(server),
        "next": last if more else None,
        "counts": server.store.count_active(),
    }


def _show(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    return server.visible(caller, server.store.get(_job_id(args)))


def _logs(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    job = server.owned_job(caller, _job_id(args))
    offset = max(0, _arg(args, "offset", int, default=0))
    limit = min(MAX_LOG_CHUNK, max(1, _arg(args, "max_bytes", int, default=MAX_LOG_CHUNK)))
    data, next_offset = b"", offset
    if job.log_path:
        try:
            # O_NOFOLLOW: the daemon reads only the file it created, never a planted link.
            fd = os.open(job.log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        except OSError as exc:
            raise GpuschedError(f"cannot read the log of job {job.id}: {exc.strerror}") from None
        if fd >= 0:
            try:
                # Offsets count all the job wrote: a log cut at max_log_size is read
                # around its cut, so a follower neither re-reads nor waits (logcap).
                data, next_offset = read_log(fd, offset, limit)
            except OSError as exc:
                raise GpuschedError(
                    f"cannot read the log of job {job.id}: {exc.strerror}"
                ) from None
            finally:
                os.close(fd)
    return {
        "data": base64.b64encode(data).decode("ascii"),
        "offset": next_offset,
        "ended": job.state in TERMINAL_STATES,
        "state": str(job.state),
        "log_path": job.log_path,
    }


def _cancel_mine(server: Server, caller: Caller, waiting_only: bool) -> Any:
    """Every active job of the caller's own (root's and admins' too: others' only by id)."""
    ids = server.scheduler.cancel_waiting(caller.uid, caller.user)
    running = [] if waiting_only else [j for j in server.store.running() if j.uid == caller.uid]
    return _cancelled(server, caller, ids, running, waiting_only)


def _cancel(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    if _arg(args, "mine", bool, default=False):
        return _cancel_mine(server, caller, _arg(args, "waiting_only", bool, default=False))
    if args.get("array") is not None:
        return _cancel_array(server, caller, _arg(args, "array", int))
    job = server.owned_job(caller, _job_id(args))
    return server.visible(caller, server.scheduler.cancel(job, by=caller.user))


def _hold(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    return server.visible(caller, server.scheduler.hold(server.owned_job(caller, _job_id(args))))


def _release(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    return server.visible(caller, server.scheduler.release(server.owned_job(caller, _job_id(args))))


def _wait(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    ids = _int_list(args, "ids")
    if not ids:
        raise UsageError("no job ids to wait for")
    found = server.store.states_of(ids)
    for job_id in ids:
        if job_id not in found:  # unknown ids fail now, not after the timeout
            raise NotFoundError(f"no job {job_id}")
    timeout = float(_arg(args, "timeout", (int, float), default=MAX_WAIT_S))
    timeout = min(max(timeout, 0.0), MAX_WAIT_S)
    server.scheduler.wait_until_ended(ids, timeout)
    return _job_list(server, caller, ids)


def _estimate_history(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    """A --mem for a command from the peaks of the caller's own earlier runs of it."""
    command = _str_list(args, "command")
    if not command:
        raise UsageError("no command given: gpusched estimate --history -- COMMAND [ARGS...]")
    runs = server.store.peaks_for_command(caller.uid, command)
    if not runs:
        raise NotFoundError(
            "no earlier run of this exact command by you ended with a measured peak: run it"
            " once with --mem SIZE (`gpusched estimate --params ...` gives a first figure)"
        )
    peak = max(peak for _, peak, _ in runs)
    return {
        "command": command,
        "jobs": [{"id": i, "peak_mem": p, "mem": m} for i, p, m in runs],
        "peak_mem": peak,
        "suggested_mem": suggest_mem(peak),
    }


def _history(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    limit = _arg(args, "limit", int, default=50)
    if limit < 1:
        raise UsageError("--limit must be at least 1")
    user = _arg(args, "user", str)
    states = TERMINAL_STATES
    if args.get("states") is not None:
        names = _str_list(args, "states")
        unknown = sorted(set(names) - {str(s) for s in TERMINAL_STATES})
        if unknown or not names:
            raise UsageError(
                f"--state {','.join(unknown) or '(none)'}: an ended job is one of "
                + ", ".join(sorted(str(s) for s in TERMINAL_STATES))
            )
        states = frozenset(JobState(name) for name in names)
    since = _arg(args, "since", str)
    if since is not None:
        since = _utc_iso(since)
    found = server.store.ended_ids(min(limit, 10000), user=user, states=states, since=since)
    return _job_list(server, caller, found)


def _utc_iso(text: str) -> str:
    """An ISO timestamp with its time zone, as `ended_at` is stored (UTC, milliseconds)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"'since': not an ISO date and time: {text!r}") from None
    if moment.tzinfo is None:
        raise UsageError(f"'since': {text!r} has no time zone")
    try:
        return iso(moment.astimezone(timezone.utc))
    except OverflowError:  # 0001-01-01T00:00+05:00 is before the year 1 in UTC
        raise UsageError(f"'since': {text!r} is out of range in UTC") from None


def _drain(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    """An administrator stops new jobs from starting (on=true) or lets them start again."""
    if not caller.admin:
        raise PermissionDenied(
            f"only an administrator (root or one listed in `admins`) may drain; {caller.user}"
            " is not one"
        )
    if _arg(args, "on", bool, required=True):
        reason = _arg(args, "reason", str)
        if reason is not None and not 0 < len(reason) <= MAX_REASON_CHARS:
            raise UsageError(f"a drain reason is 1 to {MAX_REASON_CHARS} characters")
        drain = Drain(caller.user, iso(utc_now()), None if reason is None else _text(reason))
        server.scheduler.set_drain(drain)
    else:
        server.scheduler.set_drain(None)
    return _drain_json(server)


def _drain_json(server: Server) -> dict[str, Any] | None:
    drain = server.scheduler.drain
    return None if drain is None else drain.to_json()


HANDLERS: dict[str, Handler] = {
    "ping": _ping,
    "submit": _submit,
    "status": _status,
    "show": _show,
    "logs": _logs,
    "cancel": _cancel,
    "hold": _hold,
    "release": _release,
    "wait": _wait,
    "history": _history,
    "priority": _priority,
    "requeue": _requeue,
    "array": _array,
    "estimate_history": _estimate_history,
    "drain": _drain,
}
