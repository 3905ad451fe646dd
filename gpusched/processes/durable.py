"""Files the daemon and the supervisor write so that they survive a crash or a power cut:
a JSON record replaced in one rename (a job's spec, the drain, the boot record), a
directory's names made durable, and a record whose space is reserved in advance (a job's
exit record) so that writing it never needs space the disk may no longer have.

A reserved record is a file of RECORD_BYTES blanks, its blocks allocated when the job
starts (posix_fallocate, then written over, so that they are allocated and written on
any filesystem that overwrites in place). The record is later written over those blanks,
padded with blanks to the same size, and fsynced: no new block is needed, so a disk
filled meanwhile (by the job's own log, say) cannot cost the job its exit code. Blanks
are JSON whitespace: a reserved record not yet written reads as empty (`is_blank`).
Copy-on-write filesystems (btrfs, ZFS) allocate even for an overwrite: there the
reservation narrows the window, it does not close it.

Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

# The space reserved for a job's exit record: far more than one takes (a few hundred
# bytes; a message quoting a long path a few KiB). A longer record is written by rename.
RECORD_BYTES = 16384
BLANK = b" "
# What a full disk or a quota says.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_json_atomically(path: Path, data: dict[str, Any], durable: bool = True) -> None:
    """Replace `path` with `data` in one rename; `durable` also fsyncs it to disk."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_directory(path.parent)  # so the rename itself survives a power cut


def fsync_directory(path: Path) -> None:
    """Make the names created, renamed or removed in `path` durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def reserve_record(path: Path, size: int = RECORD_BYTES) -> None:
    """Create `path` (which must not exist) as `size` blanks, its blocks allocated now.

    Raises OSError (ENOSPC when the disk is already full); leaves no file then.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        _write_all(fd, BLANK * size)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def write_record(path: Path, data: dict[str, Any]) -> None:
    """Write `data` durably at `path`: over the space reserved there if there is enough
    (reserve_record), else replaced in one rename (write_json_atomically)."""
    if not _write_reserved(path, json.dumps(data).encode()):
        write_json_atomically(path, data)


def _write_reserved(path: Path, body: bytes) -> bool:
    """Write `body` over the reserved record at `path`, padded with blanks, and fsync it;
    False (nothing written) when `path` holds no reservation that large."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if len(body) > size:
            return False
        # One write of the whole reservation: a torn one leaves unreadable JSON (the job
        # reads as lost, as with no record), never another record's tail.
        _write_all(fd, body + BLANK * (size - len(body)))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data: bytes) -> None:
    """pwrite `data` at offset 0 in full (a regular file's write may still be partial)."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def is_blank(data: bytes) -> bool:
    """Whether a record read back holds nothing yet (a reservation, or zeros a crash left)."""
    return not data.strip(b" \0\n")
