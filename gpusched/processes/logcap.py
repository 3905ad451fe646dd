"""The job log's size cap: cutting a log's middle (supervisor) and reading around the cut.

A job writes its stdout and stderr straight into its log (an O_APPEND descriptor the
supervisor opened), so the log is capped in place: when it is over `max_log_size`, the
supervisor keeps its head (the first `head_bytes(cap)` bytes: how the job started) and
its most recent output (the last half of the cap), and puts one marker line of fixed
length between them:

    [gpusched: 123456 bytes of output dropped here (max_log_size)]

The job's next writes land at the new end (O_APPEND). A later cut replaces the marker
with one counting everything dropped so far. The daemon cuts a log the same way, to a
smaller cap, when its owner's share of log_dir is full (the marker then names
`retention.user_log_bytes`); an exclusive flock on the log keeps two cutters apart.

Readers (`gpusched logs`, also `-f`) ask for *stream offsets*: positions in everything
the job wrote, the dropped part included. `read_log` maps them onto the cut file, so a
follower never re-reads what it has seen and never waits past the end of a shorter
file: one whose next byte was dropped gets the marker and what follows it.

The marker is also the cut's lock: the supervisor first replaces the bytes at the cut
with a "trimming" marker of the same length, moves the tail, then writes the final
marker; a reader checks the marker before and after its read and retries if it changed.

Stdlib only: the supervisor imports this at start-up.
"""

from __future__ import annotations

import fcntl
import os
import re
import time

HEAD_MAX_BYTES = 64 * 1024
MARKER_BYTES = 100  # every marker, final or "trimming", is this long (space padded)
_COPY_CHUNK = 1 << 20
_MARKER_RE = re.compile(rb"\n\[gpusched: (?:(\d{1,20}) bytes of output dropped|trimming)")
_TRIMMING = b"\n[gpusched: trimming"


def head_bytes(cap: int) -> int:
    """How much of the log's beginning a cut keeps."""
    return min(HEAD_MAX_BYTES, cap // 4)


def _marker(text: bytes) -> bytes:
    return text[: MARKER_BYTES - 1].ljust(MARKER_BYTES - 1) + b"\n"


def _final_marker(dropped: int, why: bytes) -> bytes:
    return _marker(b"\n[gpusched: %d bytes of output dropped here (%s)]" % (dropped, why))


def _state_at(fd: int, position: int) -> tuple[bool, int] | None:
    """What the marker at `position` says: (trimming now, bytes dropped), or None."""
    match = _MARKER_RE.match(os.pread(fd, MARKER_BYTES, position))
    if match is None:
        return None
    return match.group(1) is None, int(match.group(1) or 0)


def cap_log(fd: int, cap: int, why: bytes = b"max_log_size") -> int:
    """Cut the log's middle if it is over `cap` bytes; returns the bytes dropped now.
    `why` is the setting the marker names. A log another cutter holds is left for now.

    `fd` must be open read-write WITHOUT O_APPEND (Linux's pwrite appends on an O_APPEND
    descriptor, wherever it is told to write). Bytes the job appends while the tail is
    moved are moved too, in one more pass; what it appends during that pass is lost, not
    counted in the marker (only a writer about as fast as the copy loses anything).
    """
    if os.fstat(fd).st_size <= cap:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    try:
        return _cut(fd, cap, why)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _cut(fd: int, cap: int, why: bytes) -> int:
    size = os.fstat(fd).st_size
    if size <= cap:
        return 0
    head = head_bytes(cap)
    before = _state_at(fd, head)
    kept_from = head + MARKER_BYTES if before is not None else head
    dropped_before = before[1] if before is not None else 0
    cut_to = size - cap // 2
    # Start the kept tail on a line boundary when there is one near.
    newline = os.pread(fd, 4096, cut_to).find(b"\n")
    if newline >= 0:
        cut_to += newline + 1
    if cut_to <= kept_from:
        return 0
    dropped_now = cut_to - kept_from
    os.pwrite(fd, _marker(_TRIMMING + b"]"), head)
    source, target = cut_to, head + MARKER_BYTES
    # Moves what was there when the cut began and what was appended while it moved, in
    # two passes at most: a writer faster than the copy must not keep the cut going.
    for _ in range(2):
        end = os.fstat(fd).st_size
        while source < end:  # target < source: a forward copy is safe
            chunk = os.pread(fd, min(_COPY_CHUNK, end - source), source)
            if not chunk:
                break
            os.pwrite(fd, chunk, target)
            source += len(chunk)
            target += len(chunk)
    # What the job appended during the second pass (a writer as fast as the copy) is lost
    # and not counted: counting it would shift the offsets of the kept tail for followers.
    os.ftruncate(fd, target)
    os.pwrite(fd, _final_marker(dropped_before + dropped_now, why), head)
    return dropped_now


def _find_cut(fd: int, size: int) -> tuple[int, bool, int] | None:
    """(position, trimming now, bytes dropped) of the log's marker, or None if never cut."""
    window = os.pread(fd, min(size, HEAD_MAX_BYTES + MARKER_BYTES), 0)
    match = _MARKER_RE.search(window)
    if match is None or match.start() + MARKER_BYTES > size:
        return None
    return match.start(), match.group(1) is None, int(match.group(1) or 0)


def read_log(fd: int, offset: int, limit: int, patience_s: float = 2.0) -> tuple[bytes, int]:
    """Up to `limit` bytes of the job's output from stream `offset`, and the next offset.

    Waits up to `patience_s` for a cut in progress, then reads the file as it is.
    The marker is found by its text in the log's first 64K: a job can print one itself,
    which confuses only the offsets of its own log's readers, never what they are shown.
    """
    deadline = time.monotonic() + patience_s
    while True:
        size = os.fstat(fd).st_size
        cut = _find_cut(fd, size)
        if cut is None:
            start = min(offset, size)
            data = os.pread(fd, limit, start)
            if _find_cut(fd, os.fstat(fd).st_size) is None:
                # Past the end of a log cut by no one (e.g. recreated): wait at its end.
                return data, (offset if offset > size else start) + len(data)
        elif not cut[1]:
            data, next_offset = _read_cut(fd, offset, limit, cut[0], cut[2])
            after = _find_cut(fd, os.fstat(fd).st_size)
            if after == cut:
                return data, next_offset
        if time.monotonic() >= deadline:
            # A cut this slow, or a "trimming" line the job printed itself: read the file
            # as it is, so no output can be hidden from its reader by a forged marker.
            start = min(offset, os.fstat(fd).st_size)
            data = os.pread(fd, limit, start)
            return data, start + len(data)
        time.sleep(0.01)


def _read_cut(fd: int, offset: int, limit: int, head: int, dropped: int) -> tuple[bytes, int]:
    if offset < head:  # in the head: read up to the marker, no further
        data = os.pread(fd, min(limit, head - offset), offset)
        return data, offset + len(data)
    if offset < head + dropped:  # its next byte was dropped: the marker and what follows
        data = os.pread(fd, max(limit, MARKER_BYTES), head)
        if len(data) < MARKER_BYTES:
            return b"", offset
        return data, head + dropped + len(data) - MARKER_BYTES
    # Clamped: a client's offset may be any number (pread raises beyond 2**63).
    position = min(offset - dropped + MARKER_BYTES, os.fstat(fd).st_size)
    data = os.pread(fd, limit, position)
    return data, offset + len(data)
