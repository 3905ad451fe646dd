"""Saying a recurring problem once a minute, not once a pass or once a connection.

An accept loop out of open files, a scheduling pass that fails the same way every two
seconds, a job that cannot start for want of tasks: each would flood the journal (and
fill the disk) if logged every time. `RateLimitedLog` says it once per interval, with
how often it happened meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """Say a recurring problem at most once per `every_s`, with how often it happened."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self._log = logger
        self._every_s = every_s
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every_s:
                self._since[key] = self._since.get(key, 0) + 1
                return
            repeats = self._since.pop(key, 0)
            self._last[key] = now
        more = f" ({repeats} more times in the last minute)" if repeats else ""
        self._log.warning("%s%s", message, more, exc_info=exc_info)

    def clear(self, key: str) -> bool:
        """Forget `key` (the problem passed); True if it had been reported."""
        with self._lock:
            self._since.pop(key, None)
            return self._last.pop(key, None) is not None
