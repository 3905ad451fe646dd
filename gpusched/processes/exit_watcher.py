"""Watching job supervisors for their exit: a pidfd each, polled when none can be had.

One thread waits on the pidfds of every watched supervisor, which works the same for
the launcher's child, the zygote's child and a supervisor adopted after a daemon
restart. When the daemon is down to its reserve of open files (a pidfd is one per
running job), a supervisor is polled once a second instead (by pid and start time, so a
recycled pid is not taken for it) until a pidfd can be had. Exits are reported from the
watcher thread only, never from `watch()`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import threading
from collections.abc import Callable

from gpusched.processes.fdbudget import FD_RESERVE, files_left
from gpusched.processes.pidref import still_running

log = logging.getLogger("gpusched.launcher")


class ExitWatcher:
    """Calls `on_exits(job_ids)` from its own thread as watched processes end."""

    def __init__(self, on_exits: Callable[[list[int]], None]) -> None:
        self._on_exits = on_exits
        self._selector = selectors.DefaultSelector()
        self._watched: dict[int, int] = {}  # pidfd -> job id
        self._already_exited: list[int] = []  # watched after their process had ended
        self._polled: dict[int, tuple[int, str | None]] = {}  # job id -> pid, start: no pidfd
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._thread = threading.Thread(target=self._watch_loop, name="job-watcher", daemon=True)
        self._thread.start()

    def watch(self, job_id: int, pid: int, start_time: str | None = None) -> None:
        """Report `job_id` once `pid` (which started at `start_time`) has exited."""
        with self._lock:
            try:
                if files_left() < FD_RESERVE:  # the reserve is for starting jobs, not this
                    raise OSError(errno.EMFILE, "open files down to the reserve")
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._already_exited.append(job_id)
            except OSError as exc:  # out of open files: poll until a pidfd can be had
                if not self._polled:
                    log.warning("cannot watch job %s through a pidfd (%s): polling", job_id, exc)
                self._polled[job_id] = (pid, start_time)
            else:
                self._watched[pidfd] = job_id
                self._selector.register(pidfd, selectors.EVENT_READ)
        with contextlib.suppress(BlockingIOError):  # a full pipe: the loop wakes anyway
            os.write(self._wake_w, b"x")

    def _poll_unwatched(self) -> list[int]:
        """Jobs polled for want of a pidfd: those whose process ended; a pidfd for the rest."""
        exited = []
        with self._lock:
            spare = files_left() - FD_RESERVE
            for job_id, (pid, start_time) in list(self._polled.items()):
                try:
                    if spare <= 0:
                        raise OSError(errno.EMFILE, "open files down to the reserve")
                    spare -= 1
                    pidfd = os.pidfd_open(pid)
                except ProcessLookupError:
                    pidfd = None
                except OSError:  # still out of files
                    if still_running(pid, start_time):
                        continue
                    pidfd = None
                if pidfd is not None and still_running(pid, start_time):
                    self._watched[pidfd] = job_id
                    self._selector.register(pidfd, selectors.EVENT_READ)
                elif pidfd is not None:
                    os.close(pidfd)  # the pid is another process's by now
                    pidfd = None
                if pidfd is None:
                    exited.append(job_id)
                del self._polled[job_id]
        return exited

    def _watch_loop(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select(timeout=1.0):
                fd = int(key.fd)
                with self._lock:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        exited, self._already_exited = self._already_exited, []
                    else:
                        exited = [self._watched.pop(fd)]
                        self._selector.unregister(fd)
                        os.close(fd)
                if exited:
                    self._report(exited)
            if self._polled:
                exited = self._poll_unwatched()
                if exited:
                    self._report(exited)

    def _report(self, job_ids: list[int]) -> None:
        try:
            self._on_exits(job_ids)
        except Exception:  # the watcher must outlive any bug in a callback
            log.exception("handling the exit of jobs %s failed", job_ids)

    def close(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
