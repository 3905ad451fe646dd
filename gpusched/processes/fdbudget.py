"""The daemon's open files: how many are left, and the reserve nothing optional may take.

Each client connection costs a descriptor, and so does each running job (the pidfd that
watches its supervisor). Both stop taking more when fewer than `FD_RESERVE` are left: a
new connection is refused (listening.py), a new job is polled instead of watched
(launcher.py). What the reserve keeps is for what must not fail for want of a file:
starting a job (its spec, the fork), the database, logs and hooks.
"""

from __future__ import annotations

import os
import resource
import threading
import time

FD_RESERVE = 64


def open_fds() -> int:
    """Descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listdir's own descriptor
    except OSError:
        return 0  # cannot tell (or out of files this very moment): let accept decide


class FdReserve:
    """How many open files remain under the soft limit, against a `reserve` to keep.

    Counting /proc/self/fd costs a little per open file, so a count is reused for a
    moment unless connections accepted since could have used up the margin.
    """

    RECOUNT_S = 0.2

    def __init__(self, reserve: int) -> None:
        self.reserve = reserve
        self._counted_at = -1e9
        self._count = 0
        self._since = 0
        self._lock = threading.Lock()

    def left(self) -> int:
        """Open files left under the soft limit (an estimate, never too high for long)."""
        with self._lock:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if limit == resource.RLIM_INFINITY:
                return 2**31
            now = time.monotonic()
            estimate = self._count + self._since
            if now - self._counted_at > self.RECOUNT_S or limit - estimate < 2 * self.reserve:
                self._count, self._counted_at, self._since = open_fds(), now, 0
                estimate = self._count
            self._since += 1
            return limit - estimate


def files_left() -> int:
    """Open files left under the soft limit now (exact, so a little dearer than FdReserve)."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 2**31 if limit == resource.RLIM_INFINITY else limit - open_fds()
