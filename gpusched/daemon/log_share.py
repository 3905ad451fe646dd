"""Each user's share of `log_dir` (`retention.user_log_bytes`), beside each job's cap.

`max_log_size` bounds one job's log; this bounds all of one user's logs together, so a
sweep of big logs cannot fill `log_dir` for everyone. At each check the sizes of a
user's logs are added up (st_size; an ended log does not grow, so its size is read once
and remembered); past the share, that user's oldest ended logs are removed first (the
row says why in `log_removed`, which `show` prints), then, if still over, each of their
running logs is cut to an even part of what is left, as the supervisor cuts at
`max_log_size` (gpusched.processes.logcap). No other user's log is touched.

The daemon checks every few seconds (CHECK_EVERY_S) and within TICK_S of a job's end: a
log can grow by hundreds of megabytes between two retention passes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections import defaultdict
from pathlib import Path

from gpusched.config.holder import ConfigHolder
from gpusched.processes.logcap import cap_log
from gpusched.store import Database
from gpusched.store.retention import KeptLog, forget_log, logs_in

log = logging.getLogger("gpusched.retention")

CHECK_EVERY_S = 2.0
TICK_S = 0.5  # how often the daemon calls `tick`: cheap unless a check is due
SHARE_FULL = "its owner's log share was full"
MIN_CUT_BYTES = 64 * 1024  # as max_log_size's least: a cut log keeps a useful head and tail
_WHY = b"retention.user_log_bytes"


class LogShares:
    def __init__(self, settings: ConfigHolder, database: Database) -> None:
        self._settings = settings
        self.database = database
        self._ended_sizes: dict[tuple[int, str], int] = {}  # (job, path) -> bytes
        self._lock = threading.Lock()  # one check at a time: the ticker's and a job end's
        self.due = threading.Event()  # a job ended: check at the next tick
        self._last = float("-inf")  # monotonic time of the last check

    def job_ended(self, job_id: int, hooks_due: bool) -> None:
        """An end listener: ask for a check (the caller is the launcher's thread)."""
        self.due.set()

    def tick(self) -> None:
        """From the daemon's ticker: a check if one is due."""
        now = time.monotonic()
        if self.due.is_set() or now - self._last >= CHECK_EVERY_S:
            self._last = now
            self.check()

    def check(self) -> int:
        """One check of every user's share; returns the bytes freed."""
        share = self._settings.current.retention.user_log_bytes
        if share is None:
            return 0
        self.due.clear()
        with self._lock:
            log_dir = self._settings.current.log_dir
            kept = logs_in(self.database, str(log_dir))
            self._ended_sizes = {
                key: size
                for key, size in self._ended_sizes.items()
                if key in {(k.job_id, k.path) for k in kept}
            }
            by_user: dict[str, list[tuple[KeptLog, int]]] = defaultdict(list)
            for each in kept:
                by_user[each.user].append((each, self._size(each)))
            return sum(
                self._bring_under(user, logs, share, log_dir)
                for user, logs in by_user.items()
                if sum(size for _, size in logs) > share
            )

    def _size(self, kept: KeptLog) -> int:
        key = (kept.job_id, kept.path)
        if not kept.running and key in self._ended_sizes:
            return self._ended_sizes[key]
        try:
            found = os.lstat(kept.path)
        except OSError:
            size = 0
        else:
            size = found.st_size if stat.S_ISREG(found.st_mode) else 0
        if not kept.running:
            self._ended_sizes[key] = size
        return size

    def _bring_under(
        self, user: str, logs: list[tuple[KeptLog, int]], share: int, log_dir: Path
    ) -> int:
        """Remove `user`'s oldest ended logs, then cut their running ones, until their
        logs fit in `share`; the bytes freed."""
        total = sum(size for _, size in logs)
        freed, removed = 0, 0
        for kept, size in logs:  # oldest end first, the running ones last
            if total - freed <= share or kept.running:
                break
            if forget_log(self.database, kept.job_id, kept.path, SHARE_FULL):
                with contextlib.suppress(OSError):
                    if Path(kept.path).parent == log_dir and not os.path.islink(kept.path):
                        os.unlink(kept.path)
                freed += size
                removed += 1
        running = [kept for kept, _ in logs if kept.running]
        if total - freed > share and running:
            left = share - sum(size for kept, size in logs if not kept.running) + freed
            cap = max(MIN_CUT_BYTES, max(0, left) // len(running))
            freed += sum(_cut(kept.path, cap) for kept in running)
        log.warning(
            "log share: %s's logs were over %s bytes: %s ended log(s) removed, %s bytes freed",
            user,
            share,
            removed,
            freed,
        )
        return freed


def _cut(path: str, cap: int) -> int:
    """Cut a running job's log to `cap` as its supervisor would; the bytes dropped."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        return cap_log(fd, cap, _WHY)
    except OSError:
        return 0
    finally:
        os.close(fd)
