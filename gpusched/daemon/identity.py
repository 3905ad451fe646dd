"""Who is asking: the caller as the kernel identifies it (SO_PEERCRED), and the account on
this host behind a uid: its name, its login group, and whether it may enter a directory
(asked as that user, never decided by root).

Shared by the server (which identifies each connection), auth.py (which decides what a
Caller may do and see) and the request handlers (which check a submitted job's working
directory). Only the standard library (and
gpusched.processes.supervisor's credentials, itself stdlib): no store, no scheduler.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import stat
import subprocess
from dataclasses import dataclass
from typing import Any

from gpusched.processes.credentials import owner_credentials

log = logging.getLogger("gpusched.identity")


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from the socket's peer credentials, never from the request.

    `admin`: may act on every job (root, the daemon's own user, or listed in `admins`).
    """

    pid: int
    uid: int
    gid: int
    user: str
    admin: bool


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def account_gid(caller: Caller) -> int:
    """The caller's primary group as at login, whatever group the client process ran with."""
    try:
        return pwd.getpwuid(caller.uid).pw_gid
    except KeyError:
        return caller.gid


# Asked of /bin/sh as the user: `cd -P` is chdir(2) on the path as given (physical, like
# the job's own chdir), the path is an argument, never part of the script.
_ENTER_SCRIPT = 'cd -P -- "$1"'
# `submit --output`: the log's directory must be one the user may create files in.
_WRITE_SCRIPT = 'cd -P -- "$1" && test -w .'
ENTER_CHECK_TIMEOUT_S = 10.0
_SHORT_OF_RESOURCES = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})
# util-linux's setpriv switches uid, gid and groups (real, effective and saved), then
# execs. Started without a credentials change, Popen may vfork; with one it must fork the
# whole daemon, which made a user's submit about twice as slow on a loaded test machine.
SETPRIV = "/usr/bin/setpriv"


def can_write_in(uid: int, gid: int, path: str) -> str | None:
    """Why `uid` may not create files in directory `path` (`submit --output`), or None;
    asked as `can_enter` asks, of the kernel as the user."""
    refused = f"--output: directory {path} does not exist or you cannot write in it"
    return can_enter(uid, gid, path, script=_WRITE_SCRIPT, refused=refused)


def sticky_shared(path: str) -> str | None:
    """Why `submit --output` may not write in directory `path`: one every user may create
    files in, sticky (like /tmp), where anyone can plant links or files at the names of a
    user's future job ids and make their jobs fail to start; None otherwise. Asked after
    `can_write_in`: the user can see the directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # gone since: the supervisor's own open refuses it
    if mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        return (
            f"--output: directory {path} is shared by every user (sticky, world-writable):"
            " anyone could plant files at your jobs' log names; use a directory of your own"
        )
    return None


def can_enter(
    uid: int,
    gid: int,
    path: str,
    *,
    script: str = _ENTER_SCRIPT,
    refused: str | None = None,
) -> str | None:
    """Why `uid` may not chdir into `path`, or None if it can.

    Asked of the kernel as the user (their uid, gid and groups, an empty environment), in
    a short `/bin/sh` child: a check by the daemon itself would run as root, follow the
    user's symlinks where they could not go, and tell them which paths exist. The daemon
    is multi-threaded, so the switch is setpriv's, or Popen's (in C, before exec), never
    Python code between fork and exec. Refused with one message whatever the reason, so
    the answer says no more about a path than the user's own `cd` would.
    """
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid} has no account on this server"
    refused = refused or f"working directory {path} does not exist or you cannot enter it"
    try:
        check = subprocess.Popen(
            [*_switch(uid, gid, name), "/bin/sh", "-c", script, "gpusched-cd", path],
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            cwd="/",
            **_credentials(uid, gid, name),
        )
    except ValueError:  # a NUL byte: no such path can exist
        return refused
    except OSError as exc:
        if exc.errno in _SHORT_OF_RESOURCES:
            # The server is out of tasks, memory or files right now (a job may have filled
            # the service's task limit): this check is only an early answer, the job's own
            # chdir, done as the user at its start, is the guarantee. Refusing here would
            # turn one user's runaway job into everyone's failed submit.
            log.warning("cannot check a working directory now (%s): left to the job's start", exc)
            return None
        return f"cannot check working directory {path}: {exc.strerror}"
    try:
        code = check.wait(timeout=ENTER_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # e.g. a hung network filesystem
        check.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            check.wait(timeout=1.0)  # one stuck in the kernel is reaped by a later Popen
        return f"cannot check working directory {path}: no answer within {ENTER_CHECK_TIMEOUT_S:g}s"
    return None if code == 0 else refused


def _switch(uid: int, gid: int, name: str) -> list[str]:
    """The setpriv prefix that runs a command as the user, when root and setpriv can."""
    if os.geteuid() != 0 or uid == 0 or not os.access(SETPRIV, os.X_OK):
        return []
    groups = ",".join(str(g) for g in os.getgrouplist(name, gid))
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", f"--groups={groups}", "--"]


def _credentials(uid: int, gid: int, name: str) -> dict[str, Any]:
    """Popen's own switch, when there is no setpriv to do it (a single-user daemon: none)."""
    if _switch(uid, gid, name):
        return {}
    groups = os.getgrouplist(name, gid) if os.geteuid() == 0 else []
    return owner_credentials(uid, gid, groups)
