"""A bound on every wait for the PostgreSQL server, whatever the network between does.

libpq bounds the connection (connect_timeout) and TCP bounds what the kernel can see
(keepalives, tcp_user_timeout), but a server or a middlebox that takes the bytes and never
answers (a partition behind a proxy or a NAT, a stopped process, a frozen host) leaves a
query, a COMMIT, a ROLLBACK or the pool's ping waiting forever, and the thread with it: a
request, or the daemon's pass while it holds the scheduler's lock.

`WaitBound.guard(engine)` wraps the dialect's calls that wait for the server (execute,
executemany, commit, rollback, ping): while one of them runs, a watchdog thread holds its
deadline, and past it shuts the connection's socket down. The call then fails at once
with the driver's own OperationalError ("no answer from the database within 5 s"), the
connection is counted as lost (SQLAlchemy invalidates it and the pool, and opens new ones
when the database answers again), and whoever asked gets the usual one-line message.

Work that may legitimately wait longer (a schema upgrade waiting for another daemon's,
the copy of a whole queue) runs inside `unbounded()`.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

_local = threading.local()


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """Waits for the server made by this thread meanwhile have no bound."""
    before = getattr(_local, "unbounded", False)
    _local.unbounded = True
    try:
        yield
    finally:
        _local.unbounded = before


class _TimedOut(Exception):
    """Marks a driver error caused by the watchdog (its __cause__)."""


def timed_out(exc: BaseException) -> bool:
    """Whether this error (SQLAlchemy's, or the driver's) is the watchdog's: no answer
    within the bound, rather than a connection found closed."""
    driver_error = getattr(exc, "orig", exc)
    return isinstance(getattr(driver_error, "__cause__", None), _TimedOut)


def _socket_of(dbapi_connection: Any) -> int | None:
    raw = getattr(dbapi_connection, "dbapi_connection", dbapi_connection)  # a pool's fairy
    raw = getattr(raw, "driver_connection", raw)
    try:
        fd = raw.pgconn.socket
    except Exception:  # closed already, or not psycopg: nothing to bound
        return None
    return int(fd) if isinstance(fd, int) and fd >= 0 else None


def _shut_down(fd: int) -> None:
    # shutdown() acts on the socket, not the descriptor: a duplicate reaches it, and the
    # driver's own descriptor stays open for it to close.
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        with sock:
            sock.shutdown(socket.SHUT_RDWR)


class WaitBound:
    """One watchdog thread for every guarded engine of the process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, int] = {}  # token -> socket fd, while its call waits
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def waiting(self, dbapi_connection: Any, bound_s: float) -> Iterator[int]:
        fd = None if getattr(_local, "unbounded", False) else _socket_of(dbapi_connection)
        token = next(self._tokens)
        if fd is None:
            yield token
            return
        with self._cond:
            self._armed[token] = fd
            heapq.heappush(self._heap, (time.monotonic() + bound_s, token))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="db-wait-bound", daemon=True
                )
                self._thread.start()
            if self._heap[0][1] == token:  # the earliest deadline now: wake the watchdog
                self._cond.notify()
        try:
            yield token
        finally:
            # Under the lock: once disarmed, the watchdog can no longer shut down this
            # descriptor, which the driver may close (and the kernel reuse) right after.
            with self._cond:
                self._armed.pop(token, None)
                self._fired.discard(token)

    def fired(self, token: int) -> bool:
        """Whether the watchdog shut this call's connection (asked before it is disarmed)."""
        with self._cond:
            return token in self._fired

    def _watch(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)  # that call ended in time
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                _shut_down(self._armed.pop(token))
                self._fired.add(token)

    def guard(self, engine: Engine, bound_s: float, ping_bound_s: float) -> None:
        """Bound every call of `engine`'s dialect that waits for the server: the pool's
        test of a connection (`SELECT 1`) by `ping_bound_s`, the others by `bound_s`."""
        dialect = engine.dialect
        dbapi_error = dialect.loaded_dbapi.OperationalError

        def bounded(
            call: Callable[..., Any], connection_of: Callable[..., Any], limit_s: float
        ) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.waiting(connection_of(*args), limit_s) as token:
                    try:
                        return call(*args, **kwargs)
                    except Exception:
                        if self.fired(token):
                            raise dbapi_error(
                                f"no answer from the database within {limit_s:g} s"
                            ) from _TimedOut()
                        raise

            return run

        def of_cursor(cursor: Any, *_: Any) -> Any:
            return cursor.connection

        def of_connection(connection: Any, *_: Any) -> Any:
            return connection

        for name, connection_of, limit_s in (
            ("do_execute", of_cursor, bound_s),
            ("do_executemany", of_cursor, bound_s),
            ("do_execute_no_params", of_cursor, bound_s),
            ("do_commit", of_connection, bound_s),
            ("do_rollback", of_connection, bound_s),
            ("do_ping", of_connection, ping_bound_s),
        ):
            setattr(dialect, name, bounded(getattr(dialect, name), connection_of, limit_s))

        @event.listens_for(engine, "handle_error")
        def _lost(context: ExceptionContext) -> None:
            # The socket is shut: let SQLAlchemy drop the connection (and test the pool's
            # others) rather than hand it out again.
            if isinstance(context.original_exception.__cause__, _TimedOut):
                context.is_disconnect = True


WAIT_BOUND = WaitBound()
