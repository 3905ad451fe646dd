"""Room for an SQLite database on a full disk: a reserve file beside it.

The queue's database, its WAL and -shm, and by default the jobs' exit records and logs
share one filesystem, which a job can fill. SQLite then cannot open the database (its
-shm needs pages) nor commit (the WAL grows). So the daemon keeps some of that
filesystem in a file beside the database (`.gpusched.db.reserve`: 4 MiB, at most a
sixteenth of the filesystem), taken while there is room. When the disk is nearly
full (under half the reserve free), the reserve is given back: the database opens, and
the ends of running jobs and what a restart finds are recorded. Meanwhile submits are
refused, said plainly, so that the room goes to what is already queued. Once the disk
has twice the reserve free again, the reserve is taken back and submits are accepted:
`check` (statvfs, cheap) runs at every scheduling pass and when the database opens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from gpusched.core.units import format_size

log = logging.getLogger("gpusched.store")

RESERVE_MAX_BYTES = 4 << 20


def _size(n_bytes: int) -> str:
    return format_size(n_bytes, tabular=False)


def free_bytes(path: Path) -> int:
    """The bytes this process may still write on `path`'s filesystem (root: all free)."""
    info = os.statvfs(path)
    blocks = info.f_bfree if os.geteuid() == 0 else info.f_bavail
    return blocks * info.f_frsize


class SpaceReserve:
    """The reserve file beside an SQLite database (module docstring); thread-safe."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(f".{database.name}.reserve")
        self.directory = database.parent
        self._lock = threading.Lock()
        try:
            info = os.statvfs(self.directory)
            self.size = min(RESERVE_MAX_BYTES, info.f_blocks * info.f_frsize // 16)
        except OSError:
            self.size = RESERVE_MAX_BYTES
        self.held = self.path.exists()  # one left by the last run counts as held
        self._given_back = False  # in this run: its taking back is worth a line

    @property
    def full(self) -> bool:
        """Whether the disk is full: the reserve given back (or never taken) for want of room."""
        return not self.held

    def describe(self) -> str:
        """The disk's state in words, for a refusal."""
        try:
            left = _size(free_bytes(self.directory))
        except OSError:
            left = "unknown"
        return f"the disk under {self.directory} is full ({left} free)"

    def check(self) -> None:
        """Give the reserve back when the disk is nearly full; take it when there is room."""
        with self._lock:
            try:
                free = free_bytes(self.directory)
            except OSError:
                return
            if self.held and free < self.size // 2:
                self._give_back(free)
            elif not self.held and free >= 2 * self.size:
                self._take(free)

    def _give_back(self, free: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.held, self._given_back = False, True
        log.warning(
            "the disk under %s is full (%s free): gave back the %s kept for this, so the ends"
            " of running jobs are still recorded; submits are refused until it has room",
            self.directory,
            _size(free),
            _size(self.size),
        )

    def _take(self, free: int) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as exc:  # taken by someone else meanwhile: the next check tries again
            with contextlib.suppress(OSError):
                self.path.unlink()
            log.info("cannot keep room on %s yet: %s", self.directory, exc.strerror)
            return
        if self._given_back:
            self._given_back = False
            log.warning(
                "the disk under %s has room again (%s free): submits are accepted",
                self.directory,
                _size(free),
            )
        self.held = True
