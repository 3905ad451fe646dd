"""Listeners that no client can kill or starve: accept loops, connection slots, deadlines.

Every listening socket of the daemon (the Unix socket, the metrics port, the dashboard
to come) runs a `Listener`. What it owns:

- An accept loop that survives any error of one connection. `accept` fails for reasons
  that pass (out of open files, memory, buffers; a connection aborted before it was
  taken), and a thread may fail to start (the service's task limit): each is logged once
  a minute, the loop backs off briefly and goes on. Only an error that says the listening
  socket itself is broken (closed, shut down, not a socket) ends the loop; the daemon
  then exits non-zero so systemd restarts it, rather than stay "active" while deaf.
- Connection slots: a cap in all and a cap per client (a uid on the Unix socket, a
  source address on TCP), so one client's idle connections cannot take everybody's.
- A reserve of open files: when fewer than `fd_reserve` remain, a client that already
  holds four connections is told to come back later (under half of it, every client is), so
  starting jobs, watching them and the database keep theirs, and a flood of one client
  does not shut out another's first connection.
- Spare threads, started with the listener: when no new thread can start, a connection
  waits for a spare (two per client at a time, so one client cannot hold them all), so
  someone can still cancel the job that filled the task limit.
- `DeadlineReader`: an idle timeout between requests and a total deadline per request,
  so a client that trickles a byte every few seconds (slowloris) cannot hold a slot.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import logging
import queue
import socket
import threading
import time
from collections.abc import Hashable
from typing import Any

from gpusched.processes.fdbudget import FD_RESERVE, FdReserve
from gpusched.scheduling.ratelog import RateLimitedLog

log = logging.getLogger("gpusched.listening")

# Short of files, a client may still open this many: enough for a client that connects
# once per request (the CLI) and whose last slots are not given back yet, few enough that
# nobody takes the reserve.
SHORT_PER_CLIENT = 4
SPARE_THREADS = 4  # started up front: they serve when the task limit stops new threads
SPARE_PER_CLIENT = 2  # connections of one client served or waiting for a spare at once
BACKOFF_MIN_S = 0.01
BACKOFF_MAX_S = 1.0
# Errors of `accept` that say the listening socket is gone, not that one connection or a
# resource failed: no amount of retrying helps, a restart does.
FATAL_ACCEPT_ERRNOS = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EOPNOTSUPP})


class Slots:
    """Connections held, capped in all and per client.

    `reserve`: slots of the total that only a client whose `reserved` attribute is true
    may take (the configured Prometheus scraper, so a flood cannot starve its scrapes).
    """

    def __init__(self, total: int, per_client: int, reserve: int = 0) -> None:
        self.total = total
        self.per_client = per_client
        self.reserve = reserve
        self._held: dict[Hashable, int] = {}
        self._count = 0
        self._lock = threading.Lock()

    def take(self, client: Hashable) -> str | None:
        """Take a slot for `client`: None, or why not (a message for the client)."""
        cap = self.total if getattr(client, "reserved", False) else self.total - self.reserve
        with self._lock:
            if self._count >= cap:
                return f"the server has too many open connections ({self.total}): try again"
            if self._held.get(client, 0) >= self.per_client:
                return f"too many open connections from {client} (limit {self.per_client})"
            self._held[client] = self._held.get(client, 0) + 1
            self._count += 1
            return None

    def give_back(self, client: Hashable) -> None:
        with self._lock:
            left = self._held.get(client, 0) - 1
            if left > 0:
                self._held[client] = left
            else:
                self._held.pop(client, None)
            self._count = max(0, self._count - 1)

    def held(self) -> int:
        with self._lock:
            return self._count

    def of(self, client: Hashable) -> int:
        """Connections `client` holds now."""
        with self._lock:
            return self._held.get(client, 0)


class DeadlineReader:
    """`recv` for `protocol.read_frame`: idle timeout before a request, total deadline in one.

    Call `next_request()` before reading each request; the deadline starts with its first
    byte (or at once when bytes of it are already buffered).
    """

    def __init__(self, conn: socket.socket, idle_s: float, request_s: float) -> None:
        self.conn = conn
        self.idle_s = idle_s
        self.request_s = request_s
        self._deadline: float | None = None

    def next_request(self, pending: bool = False) -> None:
        self._deadline = time.monotonic() + self.request_s if pending else None

    def recv(self, size: int) -> bytes:
        if self._deadline is None:
            timeout = self.idle_s
        else:
            timeout = self._deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError("the request did not arrive in time")
        self.conn.settimeout(timeout)
        data = self.conn.recv(size)
        if data and self._deadline is None:
            self._deadline = time.monotonic() + self.request_s
        return data


def refuse(conn: socket.socket, message: bytes) -> None:
    """Tell a connection we will not serve it, without ever blocking the accept loop."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(message)
    conn.close()


class Listener(abc.ABC):
    """One listening socket's accept loop. Subclasses say who a client is and serve it."""

    name = "listener"

    def __init__(
        self,
        sock: socket.socket,
        slots: Slots,
        fd_reserve: int = FD_RESERVE,
        spares: int = SPARE_THREADS,
    ) -> None:
        self.sock = sock
        self.slots = slots
        self.fds = FdReserve(fd_reserve)
        self.trouble = RateLimitedLog(log)
        self._stopping = False
        self._spare_work: queue.Queue[tuple[socket.socket, Hashable]] = queue.Queue()
        self._spares_busy: dict[Hashable, int] = {}  # client -> its connections for spares
        self._spares_lock = threading.Lock()
        self._spare_count = spares
        for i in range(spares):
            threading.Thread(target=self._spare, name=f"{self.name}-spare-{i}", daemon=True).start()

    # -- what a listener says -------------------------------------------------------------

    @abc.abstractmethod
    def client_of(self, conn: socket.socket, address: Any) -> Hashable:
        """Who this connection is, for the per-client cap (may raise OSError)."""

    @abc.abstractmethod
    def serve(self, conn: socket.socket, client: Hashable) -> None:
        """Serve one connection until it ends (the loop closes it and frees its slot)."""

    @abc.abstractmethod
    def refusal(self, message: str) -> bytes:
        """What a refused client is told (one line or one HTTP response)."""

    # -- the loop --------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept until close(); returns only then, or raises when the socket is broken."""
        backoff = 0.0
        while not self._stopping:
            try:
                conn, address = self.sock.accept()
            except OSError as exc:
                if self._stopping:
                    return
                if exc.errno in FATAL_ACCEPT_ERRNOS:
                    log.critical("%s: the listening socket failed: %s", self.name, exc)
                    raise
                self.trouble.warning("accept", f"{self.name}: cannot accept a connection: {exc}")
                backoff = _pause(backoff)
                continue
            try:
                self._admit(conn, address)
            except Exception as exc:  # one connection's trouble is never the loop's
                self.trouble.warning("admit", f"{self.name}: dropped a connection: {exc!r}")
                conn.close()
                backoff = _pause(backoff)
                continue
            backoff = 0.0

    def _admit(self, conn: socket.socket, address: Any) -> None:
        """Hand the connection to a thread, or refuse it (at once: backing off here would
        keep the next client waiting in the backlog behind a refused flood)."""
        try:
            client = self.client_of(conn, address)
        except OSError:
            conn.close()
            return
        left = self.fds.left()
        if left < self.fds.reserve and (
            self.slots.of(client) >= SHORT_PER_CLIENT or left < self.fds.reserve // 2
        ):
            self.trouble.warning(
                "fds", f"{self.name}: {left} open files left (reserve {self.fds.reserve}): refusing"
            )
            refuse(conn, self.refusal("the server is short of open files: try again shortly"))
            return
        why = self.slots.take(client)
        if why is not None:
            refuse(conn, self.refusal(why))
            return
        try:
            threading.Thread(target=self._run, args=(conn, client), daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread": the task limit is reached
            self.trouble.warning("thread", f"{self.name}: cannot start a thread: {exc}")
            if not self._to_spare(conn, client):
                self.slots.give_back(client)
                refuse(conn, self.refusal("the server cannot start a thread: try again shortly"))

    def _run(self, conn: socket.socket, client: Hashable) -> None:
        try:
            self.serve(conn, client)
        except Exception:  # a bug must cost one connection, not the listener
            log.exception("%s: unexpected error serving a client", self.name)
        finally:
            conn.close()
            self.slots.give_back(client)

    def _to_spare(self, conn: socket.socket, client: Hashable) -> bool:
        """Queue the connection for a spare thread; False: the client or the queue is full.

        A client's next connection may wait behind its last (a CLI connects once per
        request, and a spare sees the last one end a moment after the client does).
        """
        with self._spares_lock:
            mine = self._spares_busy.get(client, 0)
            if mine >= SPARE_PER_CLIENT or sum(self._spares_busy.values()) >= 2 * self._spare_count:
                return False
            self._spares_busy[client] = mine + 1
        self._spare_work.put((conn, client))
        return True

    def _spare(self) -> None:
        while True:
            conn, client = self._spare_work.get()
            try:
                self._run(conn, client)
            finally:
                with self._spares_lock:
                    left = self._spares_busy.pop(client, 1) - 1
                    if left:
                        self._spares_busy[client] = left

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _pause(backoff: float) -> float:
    """Sleep a little longer each time in a row something fails; the next backoff."""
    backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, backoff * 2))
    time.sleep(backoff)
    return backoff
