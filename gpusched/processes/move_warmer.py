"""Taking the cgroup move's grace period off a job's start: the daemon starts it early.

Every job's supervisor moves itself into the job's cgroup around the job's fork
(`cgroups.job_fork`). The kernel serialises cgroup moves with one global lock,
`cgroup_threadgroup_rwsem`, whose writer first waits for an RCU grace period unless
another move happened moments before: measured here, a move after 40 ms of quiet waits
7.7 ms, one 20 ms after another 0.2 ms, and one started while an earlier move waits
shares that wait (6 ms after it: 0.9 ms). That wait is the largest single step of a
short job's start (docs/benchmarks.md, dispatch).

So as soon as the daemon knows a start is likely (a job ended, or a pass launches one),
a thread of its own writes the daemon's pid to the cgroup the daemon is already in:
a move that changes nothing but starts the grace period. It passes while the daemon
commits the start and the zygote forks the supervisor, and the supervisor's move then
finds the lock warm. The write blocks only this thread; the requests that come while
one is under way make one more move, not one each. cgroup v2 mounted with
`favordynmods` has no such wait, and there this costs a system call a job.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class MoveWarmer:
    """Starts the cgroup lock's grace period in the background: `warm()` never blocks."""

    def __init__(self, own_cgroup: Path) -> None:
        self._procs = own_cgroup / "cgroup.procs"  # the daemon's own: the move is a no-op
        self._wanted = threading.Event()
        self._stopping = False
        self.moves = 0  # done so far (a figure for tests and the log, not a clock)
        self._thread = threading.Thread(target=self._run, name="cgroup-warmer", daemon=True)
        self._thread.start()

    def warm(self) -> None:
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping:
                return
            try:
                # "0": the writing process, moved to the cgroup it is in (all its threads).
                fd = os.open(self._procs, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError as exc:  # the cgroup went away: jobs' moves just wait again
                log.info("cannot warm the cgroup lock (%s): no longer trying", exc)
                return
            self.moves += 1

    def close(self) -> None:
        self._stopping = True
        self._wanted.set()
        self._thread.join(timeout=5)
