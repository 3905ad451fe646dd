"""The store's database: the `jobs` table, how its rows become Jobs, and its transactions.

The database is the truth about jobs. Every state change is one short transaction: on
SQLite it starts with BEGIN IMMEDIATE, so concurrent writers queue on the lock (with a
busy timeout) instead of failing with "database is locked" half way through; on
PostgreSQL a change of state is a conditional UPDATE (READ COMMITTED re-checks its
condition after waiting on the row's lock) and submits queue on an advisory lock
(`lock_submits`). A submit is acknowledged only once its row is committed
(synchronous=FULL; on PostgreSQL, synchronous_commit as the server is set, on by default).
The tables are in gpusched.store.schema, made and upgraded at open by
gpusched.store.migrations; how a `jobs` row becomes a Job is gpusched.store.rows.

Durability, per transaction. In WAL mode synchronous=FULL fsyncs the WAL at every
commit; NORMAL does not (the WAL is synced at the next FULL commit or checkpoint).
Either way a commit survives a crash of the daemon (it is in the OS's page cache) and
the database stays consistent after a power cut; NORMAL only risks that the *last*
transactions before a power cut or kernel crash are rolled back. Everything a user
is told (submit, cancel, hold, release, priority) and the claim that a job starts
(mark_running) are FULL. Three of the daemon's own per-job writes are NORMAL, because
a power cut kills every job anyway and the next start reconciles what they recorded
(scheduling.adoption) from facts that do survive, or the loss is harmless:
- set_pid: lost, the row is `running` with no pid; no supervisor survives a power cut,
  so the job's fate comes from its exit record (fsynced by the supervisor) or, with
  none, it is `lost`. It is never queued again after a reboot (adopt_running checks
  the boot id), since a missing log proves nothing once the page cache is gone.
- mark_ended with the supervisor's outcome: lost, the row is `running` again; the
  outcome is re-read from the same fsynced exit record. Only ended_at moves (to the
  restart) and a notification hook may run a second time.
- hooks_started (a job's notification hooks are starting): lost, they run again at the
  next start.
Each NORMAL commit is made durable by the next FULL one (the WAL is one sequence), so
the window is short while jobs flow: the next job's mark_running closes it. On PostgreSQL
the same three writes commit with synchronous_commit off, the same trade: the WAL is
flushed a moment later, by the server, and the next durable commit covers them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from gpusched.core.errors import GpuschedError
from gpusched.store import migrations
from gpusched.store.damage import damaged, first_line, is_damage, quick_check, sqlite_path
from gpusched.store.engine import (
    WRITE_WAIT_S,
    describe_url,
    is_disconnect,
    is_disk_full,
    make_engine,
    make_reader,
    unavailable,
)
from gpusched.store.space import SpaceReserve
from gpusched.store.turns import WriterTurns
from gpusched.store.waits import timed_out

log = logging.getLogger("gpusched.store")

T = TypeVar("T")

# The database and the files SQLite keeps beside it (the WAL holds recent rows in full).
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def make_private(path: Path) -> None:
    """Take group and other access away from the database and SQLite's files beside it.

    They hold every job's command and environment (tokens, keys). The daemon creates
    them 0600, but one it finds may be wider: a backup restored with `cp`, a file made
    by hand or by an older version; SQLite gives its -wal and -shm the database's mode.
    O_NOFOLLOW: a link planted at one of these names is left alone, never chmodded.
    """
    for suffix in SQLITE_SUFFIXES:
        name = path.with_name(path.name + suffix)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(name, flags)
        except OSError:  # absent (the usual case), or a link: nothing of ours to tighten
            continue
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
                os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o700)
                log.warning(
                    "%s was readable by others (mode %o): made private (%o)",
                    name,
                    stat.S_IMODE(info.st_mode),
                    stat.S_IMODE(info.st_mode) & 0o700,
                )
        except OSError as exc:
            log.warning("cannot make %s private: %s", name, exc.strerror)
        finally:
            os.close(fd)


class Database:
    """The engine and its two kinds of transaction, shared by every part of `Store` (each
    part is given this object at its construction)."""

    def __init__(
        self,
        url: str,
        lease_clock: Callable[[], float] | None = None,
        keep_room: bool = False,
        write_wait_s: float = WRITE_WAIT_S,
    ) -> None:
        """`lease_clock`: seconds since 1970 for the cluster's leases, in place of the
        database's own clock (store.nodes): a test's fixed clock. `keep_room`: keep room
        beside an SQLite file for a full disk (gpusched.store.space: the daemon does).
        `write_wait_s` (SQLite): how long a write waits for its turn and the database's
        lock, all told (gpusched.store.turns)."""
        self.where = describe_url(url)
        self.lease_clock = lease_clock
        # The connection of this thread's `snapshot()`, which its reads share.
        self._snapshot = threading.local()
        # An SQLite file's room on a full disk (gpusched.store.space); None: none kept.
        self.space: SpaceReserve | None = None
        path = sqlite_path(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not path.exists():
                path.touch(mode=0o600)
            make_private(path)
            if keep_room:
                self.space = SpaceReserve(path)
                self.space.check()  # a full disk: the reserve makes room to open and record
        self.engine = make_engine(url, write_wait_s)
        # SQLite's writers of this process, one at a time (None: PostgreSQL's row locks).
        self._turns = WriterTurns(write_wait_s, self.where) if path is not None else None
        self._reader = make_reader(url)  # snapshot()'s, on PostgreSQL
        try:
            migrations.upgrade(self.engine, self.where)
            if path is not None:
                quick_check(self.engine, path)
        except DBAPIError as exc:
            self.close()
            if path is not None and is_damage(exc):
                raise damaged(path, f"is damaged ({first_line(exc)})") from None
            if self.space is not None and (is_disk_full(exc) or self.space.full):
                # SQLite says "disk I/O error" when the -shm it needs finds no room.
                raise GpuschedError(
                    f"the database {self.where} cannot be opened: {self.space.describe()};"
                    " free some space there and start again"
                ) from None
            if is_disconnect(exc):
                raise unavailable(exc, self.where) from None
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.engine.dispose()
        if self._reader is not None:
            self._reader.dispose()

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for reading: no write lock is taken (see _on_begin). Inside this
        thread's `snapshot()`, that snapshot's connection."""
        shared: Connection | None = getattr(self._snapshot, "conn", None)
        if shared is not None:
            yield shared
            return
        with self.engine.connect().execution_options(gpusched_read=True) as conn:
            yield conn

    def snapshot(self, work: Callable[[], T]) -> T:
        """`work()` with every `read()` of this thread sharing one connection: a reply's
        reads (its page, its counts, its cards) cost one pool checkout, not one each.

        On SQLite they are one read transaction, so they agree with each other. On
        PostgreSQL they run on the reader (engine.make_reader): no test of the connection,
        no transaction (under READ COMMITTED one would not make its statements one
        snapshot anyway: a reply that needs its figures to agree reads them in one
        statement), so they cost their statements' round trips alone. A connection found
        closed at its first use (the server restarted since it was last used) is dropped
        and `work()` runs once more on a new one: it must only read. Nested, the outer one
        holds; a write inside still takes a connection of its own."""
        if getattr(self._snapshot, "conn", None) is not None:
            return work()
        if self._reader is None:
            return self._shared(self.engine.connect().execution_options(gpusched_read=True), work)
        try:
            return self._shared(self._reader.connect(), work)
        except DBAPIError as exc:
            if not exc.connection_invalidated or timed_out(exc):
                raise
            log.info("a pooled reading connection was lost (%s): read again", exc.orig)
        return self._shared(self._reader.connect(), work)

    def _shared(self, connection: Connection, work: Callable[[], T]) -> T:
        with connection as conn:
            self._snapshot.conn = conn
            try:
                return work()
            finally:
                self._snapshot.conn = None

    @contextlib.contextmanager
    def write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction; `durable=False`: synchronous=NORMAL (module docstring).
        On SQLite it first waits its turn among this process's writers, before it takes a
        connection: a writer waiting holds none that a reply's reads could use."""
        if self._turns is None:
            with self._transaction(durable, {}) as conn:
                yield conn
            return
        asked = time.monotonic()
        with self._turns.turn():
            left_s = self._turns.wait_s - (time.monotonic() - asked)
            options = {"gpusched_busy_ms": max(1000, int(left_s) * 1000)}
            with self._transaction(durable, options) as conn:
                yield conn

    @contextlib.contextmanager
    def _transaction(self, durable: bool, options: Mapping[str, Any]) -> Iterator[Connection]:
        if durable:
            with self.engine.connect().execution_options(**options) as conn, conn.begin():
                yield conn
            return
        relaxed = self.engine.connect().execution_options(gpusched_relaxed=True, **options)
        with relaxed as conn, conn.begin():
            if conn.dialect.name == "postgresql":  # the same trade as SQLite's NORMAL
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            yield conn
