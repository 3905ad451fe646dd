"""Who is asking: the caller as the kernel identifies it (SO_PEERCRED), and the account on
this host behind a uid: its name, its login group, and whether it may enter a directory.

Shared by the server (which identifies each connection) and the request handlers (which
check a submitted job's working directory). Only the standard library: no store, no
scheduler.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path


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
