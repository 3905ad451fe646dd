"""The turns of this process's write transactions on SQLite: one at a time, in the order
they asked, each waiting at most a stated bound.

SQLite has one write lock per database, and a connection that finds it taken polls for
it (its busy handler sleeps and retries) until its busy timeout runs out. Fifty request
threads and a pass polling for one lock is a lottery, not a queue: under a crowd some
waited past the timeout and their requests were refused with "database is locked"
while the lock only ever passed between the daemon's own threads. So the daemon's
writers queue here, before they take a connection, and only one at a time asks SQLite
for its lock: SQLite's busy timeout is then spent only on another process holding the
database (a copy, `sqlite3` by hand), which is a reason outside the daemon.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator

from gpusched.core.errors import GpuschedError


class WriterTurns:
    """A first-come, first-served lock with a bounded wait."""

    def __init__(self, wait_s: float, where: str) -> None:
        self.wait_s = wait_s
        self._where = where
        self._guard = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._held = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _acquire(self) -> None:
        with self._guard:
            if not self._held and not self._waiting:
                self._held = True
                return
            mine = threading.Event()
            self._waiting.append(mine)
        deadline = time.monotonic() + self.wait_s
        if mine.wait(max(0.0, deadline - time.monotonic())):
            return  # handed over by the writer before (`_release`)
        with self._guard:
            if mine.is_set():  # handed over just as the wait ran out
                return
            self._waiting.remove(mine)
        raise GpuschedError(
            f"the database {self._where} is busy: this daemon's writes waited over"
            f" {self.wait_s:.0f} s for their turn; nothing was changed"
        )

    def _release(self) -> None:
        with self._guard:
            if self._waiting:
                self._waiting.popleft().set()  # the lock passes on without being let go
            else:
                self._held = False
