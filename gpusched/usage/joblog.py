"""The daemon's two uses of a job's log besides serving it: read its end, add a note.

Both open the file the supervisor created with O_NOFOLLOW, as `logs` does: the daemon
(root) never follows a link planted at the log's name. Neither ever raises: a log that
cannot be read or written costs the OOM diagnosis or the note, never the tick.

A log at a path of the user's choice (`submit --output`, gpusched.processes.output) is read
only if it is a regular file that the job's owner owns (`owned_log`): the user chose the
directories on the way, so a file there may be anyone's (another user's, /etc/shadow's
through a directory swapped for a link) and root must not read it for them.
"""

from __future__ import annotations

import contextlib
import os
import stat

from gpusched.usage.oom import OOM_TAIL_BYTES


def owned_log(fd: int, owner: int | None) -> bool:
    """Whether the open log `fd` is a regular file, and `owner`'s when one is given and
    we are root (a user's own daemon reads only what its user could)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return False
    return owner is None or os.geteuid() != 0 or info.st_uid == owner


def read_tail(path: str | None, max_bytes: int = OOM_TAIL_BYTES, owner: int | None = None) -> str:
    """The last `max_bytes` of a log as text ("" when there is none); `owner`: read only
    a file of theirs (a log at a user's path)."""
    if not path:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        try:
            if not owned_log(fd, owner):
                return ""
            size = os.fstat(fd).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes).decode("utf-8", errors="replace")
        except OSError:
            return ""


def append_note(path: str | None, uid: int, line: str) -> None:
    """Append `gpusched: LINE` to a job's log, so its owner sees it in `gpusched logs`.

    Only to a regular file owned by the job's owner (the supervisor creates it so): a
    log replaced by something else is left alone.
    """
    if not path:
        return
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and (info.st_uid == uid or os.geteuid() != 0):
            with contextlib.suppress(OSError):
                os.write(fd, f"gpusched: {line}\n".encode())
    finally:
        os.close(fd)
