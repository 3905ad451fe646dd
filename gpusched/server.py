"""The daemon's front door: a Unix socket, one request per line, identity from the kernel.

Each connection gets a thread; each request is decoded, authenticated by the
socket's peer credentials (SO_PEERCRED: never a field the client sends, never
$USER), authorized, and dispatched through a flat table of handlers. A handler
returns a value; the server writes it. Any error in a request becomes an error
reply; nothing a client sends can stop the server.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import pwd
import socket
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpusched import __version__
from gpusched.errors import (
    ConflictError,
    GpuschedError,
    NotFoundError,
    PermissionDenied,
    ProtocolError,
    UsageError,
)
from gpusched.hints import suggest_mem
from gpusched.models import TERMINAL_STATES, Job, JobState
from gpusched.protocol import (
    MAX_REPLY_BYTES,
    decode,
    encode,
    error_reply,
    ok_reply,
    peer_credentials,
    read_frame,
)
from gpusched.scheduler import Scheduler
from gpusched.store import NewJob
from gpusched.sweep import expand

log = logging.getLogger("gpusched.server")

MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_USER = 64
IDLE_TIMEOUT_S = 60.0
MAX_WAIT_S = 30.0
MAX_LOG_CHUNK = 1 << 20
HIDDEN_COMMAND = ["(hidden)"]


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    user: str
    admin: bool


Handler = Callable[["Server", Caller, dict[str, Any]], Any]


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def _account_gid(caller: Caller) -> int:
    """The caller's primary group as at login, whatever group the client process ran with."""
    try:
        return pwd.getpwuid(caller.uid).pw_gid
    except KeyError:
        return caller.gid


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
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise UsageError(f"'{key}' is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"'{key}' must be a finite number")  # NaN would make `wait` hang
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")  # lone surrogates (PEP 383) fit JSON columns, not text ones
        except UnicodeEncodeError:
            raise UsageError(f"'{key}' is not valid UTF-8 text") from None


def _notify(args: dict[str, Any]) -> tuple[str, ...] | None:
    """`submit --notify`: an argv (the client splits the user's string with shlex)."""
    argv = _str_list(args, "notify")
    if not argv:
        return None
    if not argv[0] or len(argv) > 256 or sum(map(len, argv)) > 16384:
        raise UsageError("--notify: expected a command of reasonable length")
    return tuple(argv)


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
    value = _arg(args, key, list, default=[])
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise ProtocolError(f"'{key}' must be a list of job ids")
    for item in value:
        _check_value(key, item)
    return value


def can_enter(uid: int, gid: int, path: str) -> str | None:
    """Why `uid` could not chdir into `path`, or None if it can (checked as the kernel would,
    by mode bits along the path; the daemon is root, so os.access would always say yes)."""
    try:
        groups = set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except KeyError:
        return f"uid {uid} has no account on this server"
    current = Path("/")
    for part in Path(path).parts[1:] if path != "/" else ():
        current = current / part
        try:
            info = current.stat()
        except FileNotFoundError:
            return f"working directory {path} does not exist"
        except OSError as exc:
            return f"cannot check working directory {path}: {exc.strerror}"
        if not stat.S_ISDIR(info.st_mode):
            return f"working directory {path}: {current} is not a directory"
        if info.st_uid == uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return f"working directory {path}: you cannot enter {current} (permission denied)"
    return None


class Server:
    def __init__(
        self, scheduler: Scheduler, socket_path: Path, owner_uid: int | None = None
    ) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.config = scheduler.config
        self.socket_path = socket_path
        # Run by root: serve everyone, each as themselves. Run by a user: serve only that user.
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.single_user = self.owner_uid != 0
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._per_uid: dict[int, int] = {}
        self._per_uid_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopping = False

    # -- listening ----------------------------------------------------------------------------

    def bind(self) -> None:
        path = self.socket_path
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            if not self.single_user:
                # A directory we made for the socket must let every user reach it.
                os.chmod(path.parent, 0o755)  # noqa: S103
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # a stale socket from a daemon that died
            else:
                probe.close()
                raise GpuschedError(f"another gpusched daemon is already listening on {path}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        # Everyone may connect on a shared server: identity comes from SO_PEERCRED.
        os.chmod(path, 0o600 if self.single_user else 0o666)
        listener.listen(128)
        self._listener = listener

    def serve_forever(self) -> None:
        listener = self._listener
        if listener is None:
            raise RuntimeError("serve_forever() before bind()")
        while not self._stopping:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._stopping:
                    return
                raise
            if not self._slots.acquire(blocking=False):
                conn.close()  # too many clients at once: drop, never queue unboundedly
                continue
            try:
                uid = peer_credentials(conn)[1]
            except OSError:
                conn.close()
                self._slots.release()
                continue
            # One user's idle or stalled connections must not use up everybody's slots.
            with self._per_uid_lock:
                if self._per_uid.get(uid, 0) >= MAX_CONNECTIONS_PER_USER:
                    refused = True
                else:
                    refused = False
                    self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            if refused:
                message = f"too many open connections from uid {uid}"
                with contextlib.suppress(OSError):
                    conn.sendall(encode(error_reply(GpuschedError(message))))
                conn.close()
                self._slots.release()
                continue
            threading.Thread(target=self._serve, args=(conn, uid), daemon=True).start()

    def close(self) -> None:
        self._stopping = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- one connection -------------------------------------------------------------------------

    def _serve(self, conn: socket.socket, uid: int) -> None:
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            caller = self._identify(conn)
            buffer = bytearray()
            while True:
                try:
                    frame = read_frame(conn, buffer)
                except ProtocolError as exc:
                    conn.sendall(encode(error_reply(exc)))
                    return  # the stream is out of step: drop this connection only
                if frame is None:
                    return
                reply = self.handle_frame(caller, frame)
                try:
                    data = encode(reply, limit=MAX_REPLY_BYTES)
                except ProtocolError as exc:  # an answer no client would read: say so
                    data = encode(error_reply(exc))
                conn.sendall(data)
        except (OSError, TimeoutError):
            return  # the client went away or stalled: nothing to answer
        except Exception:
            log.exception("unexpected error serving a client")
        finally:
            conn.close()
            with self._per_uid_lock:
                self._per_uid[uid] -= 1
            self._slots.release()

    def _identify(self, conn: socket.socket) -> Caller:
        pid, uid, gid = peer_credentials(conn)
        user = _user_name(uid)
        admin = uid in (0, self.owner_uid) or user in self.config.admins
        return Caller(pid, uid, gid, user, admin)

    def handle_frame(self, caller: Caller, frame: bytes) -> dict[str, Any]:
        try:
            request = decode(frame)
            op = request.get("op")
            handler = HANDLERS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise ProtocolError(f"unknown request {op!r}")
            if self.single_user and caller.uid != self.owner_uid:
                raise PermissionDenied(
                    f"this gpusched daemon runs as {_user_name(self.owner_uid)} and serves only"
                    " that user; start your own with `gpusched daemon`, or use the system service"
                )
            return ok_reply(handler(self, caller, request))
        except GpuschedError as exc:
            return error_reply(exc)
        except Exception as exc:  # a bug must cost one request, not the daemon
            log.exception("request failed")
            return error_reply(GpuschedError(f"internal error: {type(exc).__name__}: {exc}"))

    # -- authorization ---------------------------------------------------------------------------

    def owned_job(self, caller: Caller, job_id: int) -> Job:
        job = self.store.get(job_id)
        if job.uid != caller.uid and not caller.admin:
            raise PermissionDenied(
                f"job {job_id} belongs to {job.user}: you can act only on your own jobs"
            )
        return job

    def visible(self, caller: Caller, job: Job) -> dict[str, Any]:
        job = self.scheduler.decorate(job)
        data = job.to_json()
        if job.uid != caller.uid and not caller.admin and not self.config.show_commands:
            data["command"] = HIDDEN_COMMAND
            data["cwd"] = None
        return data


# -- handlers: one per request, each returns a JSON-able value ------------------------------------


def _ping(server: Server, caller: Caller, _args: dict[str, Any]) -> Any:
    return {
        "version": __version__,
        "pid": os.getpid(),
        "user": caller.user,  # who is asking, as the daemon sees them (SO_PEERCRED)
        "uid": caller.uid,
        "daemon_user": _user_name(os.geteuid()),  # whose daemon this is
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
        problem = can_enter(caller.uid, _account_gid(caller), cwd)
        if problem is not None:
            raise UsageError(problem)
    env = _arg(args, "env", dict, default={})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("'env' must map strings to strings")
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
    if name is not None and len(name) > 200:
        raise UsageError("--name is limited to 200 characters")
    time_limit = _arg(args, "time", (int, float))
    if time_limit is not None and not 0 < time_limit < 10**9:
        raise UsageError("--time must be more than zero")
    max_concurrent = _arg(args, "max_concurrent", int)
    if max_concurrent is not None and max_concurrent < 1:
        raise UsageError("--max-concurrent must be at least 1")
    new = NewJob(
        user=caller.user,
        uid=caller.uid,
        gid=_account_gid(caller),
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
    news = [
        replace(new, command=argv, name=_text(f"{name} {label}" if name else label))
        for argv, label in expand(command, pairs)
    ]
    jobs = server.scheduler.submit_many(news, as_array=True)
    return [server.visible(caller, job) for job in jobs]


def _priority(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    job = server.owned_job(caller, _job_id(args))
    priority = _arg(args, "priority", int, required=True)
    return server.visible(caller, server.scheduler.set_priority(job, priority))


def _requeue(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    """A new job with the same spec as an ended one (its dependencies are not carried over)."""
    old = server.owned_job(caller, _job_id(args))
    if old.state not in TERMINAL_STATES:
        raise ConflictError(f"job {old.id} is {old.state}: only an ended job can be requeued")
    info = server.store.launch_info(old.id)
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
        name=old.name,
        priority=old.priority,
        time_limit_s=old.time_limit_s,
    )
    notify = server.store.notify_command(old.id)
    if notify:
        new = replace(new, notify=tuple(notify))  # the same `--notify` hook as the original
    return server.visible(caller, server.scheduler.submit(new))


def _array(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    array_id = _arg(args, "array", int, required=True)
    jobs = server.store.array_jobs(array_id)
    if not jobs:
        raise NotFoundError(f"no array a{array_id}")
    return [server.visible(caller, job) for job in jobs]


def _cancel_array(server: Server, caller: Caller, array_id: int) -> Any:
    everything = server.store.array_jobs(array_id)
    if not everything:
        raise NotFoundError(f"no array a{array_id}")
    jobs = [j for j in everything if j.state not in TERMINAL_STATES]
    owned = [server.owned_job(caller, j.id) for j in jobs]
    return [server.visible(caller, server.scheduler.cancel(j, by=caller.user)) for j in owned]


def _status(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    active = server.store.active()
    running = [j for j in active if j.state == JobState.RUNNING]
    jobs = [server.visible(caller, j) for j in active]
    if _arg(args, "all", bool, default=False):
        jobs += [server.visible(caller, j) for j in server.store.ended(limit=20)]
    return {"gpus": [g.to_json() for g in server.scheduler.gpu_reports(running)], "jobs": jobs}


def _show(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    return server.visible(caller, server.store.get(_job_id(args)))


def _logs(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
    job = server.owned_job(caller, _job_id(args))
    offset = max(0, _arg(args, "offset", int, default=0))
    limit = min(MAX_LOG_CHUNK, max(1, _arg(args, "max_bytes", int, default=MAX_LOG_CHUNK)))
    data = b""
    if job.log_path:
        try:
            # O_NOFOLLOW: the daemon reads only the file it created, never a planted link.
            fd = os.open(job.log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        except OSError as exc:
            raise GpuschedError(f"cannot read the log of job {job.id}: {exc.strerror}") from None
        if fd >= 0:
            with os.fdopen(fd, "rb") as handle:
                # Past the end: nothing to read (and no EINVAL from lseek beyond the max size).
                handle.seek(min(offset, os.fstat(handle.fileno()).st_size))
                data = handle.read(limit)
    return {
        "data": base64.b64encode(data).decode("ascii"),
        "offset": offset + len(data),
        "ended": job.state in TERMINAL_STATES,
        "state": str(job.state),
        "log_path": job.log_path,
    }


def _cancel(server: Server, caller: Caller, args: dict[str, Any]) -> Any:
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
    for job_id in ids:
        server.store.get(job_id)  # unknown ids fail now, not after the timeout
    timeout = float(_arg(args, "timeout", (int, float), default=MAX_WAIT_S))
    timeout = min(max(timeout, 0.0), MAX_WAIT_S)
    return [server.visible(caller, j) for j in server.scheduler.wait_ended(ids, timeout)]


MAX_RETRY_OOM = 10


def _retry_oom(args: dict[str, Any]) -> int:
    retries = _arg(args, "retry_oom", int, default=0)
    if not 0 <= retries <= MAX_RETRY_OOM:
        raise UsageError(f"--retry-oom must be between 0 and {MAX_RETRY_OOM}")
    return int(retries)


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
    return [
        server.visible(caller, j) for j in server.store.ended(limit=min(limit, 10000), user=user)
    ]


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
}
