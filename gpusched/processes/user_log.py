"""Opening a job's log at a path its owner chose (`submit --output`, gpusched.processes.output).

The supervisor runs as root, and the path is the user's: every directory on the way,
and the name itself, may be a link they planted, to another user's file or /etc/shadow.
So the file is opened with the owner's effective uid, gid and groups (the supervisor is
single-threaded: the switch is the whole process's, and is undone before anything else
runs), O_CREAT|O_TRUNC as their own `>` redirect would, with their umask, O_NOFOLLOW (a
link at the name is refused, not followed) and O_NONBLOCK (a FIFO cannot hang the
supervisor). What is opened must be a regular file of theirs; anything else is refused,
and the job fails to start with the reason. The open can do nothing the user could not
do themselves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence

_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_TRUNC
    | os.O_APPEND
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | os.O_NOCTTY
    | os.O_CLOEXEC
)


@contextlib.contextmanager
def _as_owner(uid: int, gid: int, groups: Sequence[int]) -> Iterator[None]:
    """Effective ids of the owner for the block (real ids stay root's to switch back)."""
    if os.geteuid() != 0 or uid == 0:
        yield
        return
    saved_groups, saved_gid = os.getgroups(), os.getegid()
    os.setgroups(list(groups))
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(saved_gid)
        os.setgroups(saved_groups)


def open_user_log(path: str, uid: int, gid: int, groups: Sequence[int], umask: int) -> int:
    """A write descriptor on the owner's log file at `path` (module docstring)."""
    previous_umask = os.umask(umask)
    try:
        with _as_owner(uid, gid, groups):
            fd = os.open(path, _FLAGS, 0o666)
    finally:
        os.umask(previous_umask)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (os.geteuid() == 0 and info.st_uid != uid):
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file of the job's owner")
    os.set_blocking(fd, True)
    return fd
