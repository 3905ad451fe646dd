"""Connections to the store's database, per dialect, and what to say when it is away.

SQLite (one server): WAL, a busy timeout and BEGIN IMMEDIATE for every write transaction,
so concurrent writers queue on the lock instead of failing half way; the daemon's own
writers queue in the process first (gpusched.store.turns), so that SQLite's busy timeout
is only ever spent on another process. Its pool holds enough connections for every
reply reading at once, and a checkout waits at most the write bound. PostgreSQL (a shared
queue): psycopg 3, READ COMMITTED, a pool whose connections are tested before use
(pool_pre_ping), so that after the server restarts the daemon reconnects by itself; and a
second, small pool for the reads of one reply (`make_reader`: `status`), neither tested
nor in a transaction, whose reads run again once on a new connection when the one they
were given turns out closed. Every wait for the server is bounded, so that a request fails
in seconds, not minutes, while the server or the network is away, and a pass never hangs
with the scheduler's lock: the connection (libpq's connect_timeout), a checkout from the
pool (pool_timeout), each statement, commit, rollback and ping (gpusched.store.waits), and
a peer that vanished without a word (TCP keepalives and tcp_user_timeout). The server
bounds its side too (docs/cluster.md section 1: lock_timeout, statement_timeout,
idle_in_transaction_session_timeout), so that a node cut off inside a transaction cannot
hold its row locks against the others. Job-state changes are conditional UPDATEs on either
(gpusched.store.transitions), which READ COMMITTED re-checks after waiting on a row lock.

Whatever is said about a database names it without its password (`describe_url`). An
outage is said once in the daemon's log (`DatabaseOutage`): while the database is away
every pass, poll and watcher that touches it fails the same way, and each would log its
own traceback (some 40 in 20 s). The first record of an outage that carries a database
error is turned into one line without its traceback; the next ones are dropped until a
statement gets an answer again, which is said in one line with how long it was away.
Requests refused meanwhile keep their own one-line warnings.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, TypeGuard
from urllib.parse import unquote

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpusched.core.errors import MAY_HAVE_BEEN_DONE, NOTHING_CHANGED, GpuschedError
from gpusched.store.waits import WAIT_BOUND

log = logging.getLogger("gpusched.database")

# What a request waiting for a PostgreSQL server that does not answer costs at most: a
# pooled connection's test (PING_BOUND_S) and a new connection's (CONNECT_TIMEOUT_S), 5 s
# in all; a server that refuses or is down fails it at once. libpq's connect_timeout is
# whole seconds, at least 2.
CONNECT_TIMEOUT_S = 3
PING_BOUND_S = 2.0
REQUEST_BOUND_S = CONNECT_TIMEOUT_S + PING_BOUND_S
# Seconds any one statement, commit or rollback may wait for the server's answer; the
# server's own statement_timeout (docs/cluster.md) is shorter, so a slow statement
# normally ends there with the server's message, and this is for a silent network.
WAIT_BOUND_S = 5.0
# Seconds a request waits for a free connection of the pool (SQLAlchemy's default: 30).
POOL_TIMEOUT_S = 5.0
# SQLite: how long a write may wait for its turn, and then for another process holding
# the database, unless the store is told otherwise (the daemon: client_request_timeout).
WRITE_WAIT_S = 30.0
# SQLite's pool: connections kept between requests, and at most this many more while
# many replies read at once (a writer takes one only on its turn: gpusched.store.turns).
SQLITE_POOL = 8
SQLITE_OVERFLOW = 56
# A peer gone without a word (host down, cable cut): TCP notices within about 11 s of
# silence (keepalive probes after 5 s idle, 3 more 2 s apart) or of unacknowledged data
# (tcp_user_timeout, in milliseconds), instead of Linux's two hours.
TCP_SETTINGS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


def describe_url(url: str) -> str:
    """The database's URL without its password: what logs and errors show."""
    parsed = make_url(url)
    bare = URL.create(
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query={k: v for k, v in parsed.query.items() if k != "password"},
    )
    return unquote(bare.render_as_string(hide_password=False))  # a socket path as a path


def make_engine(url: str, write_wait_s: float = WRITE_WAIT_S) -> Engine:
    """`write_wait_s` (SQLite): the bound of a checkout from the pool and of the busy
    timeout."""
    engine = _make_engine(url, write_wait_s)
    _listen(engine)
    return engine


def _listen(engine: Engine) -> None:
    event.listen(engine, "after_cursor_execute", _answered)
    event.listen(engine, "commit", _committing)


# The reader's connections kept open between requests (more are opened while several
# requests read at once, and closed after): a daemon holds this many more on the server.
READER_POOL = 2


def make_reader(url: str) -> Engine | None:
    """PostgreSQL: an engine for reads that retry by themselves (Database.snapshot), whose
    connections are neither tested before use nor in a transaction: a reply's reads cost
    their statements' round trips and nothing else (a test, BEGIN and ROLLBACK are one
    round trip each; on a 2-core machine under load each is milliseconds). A connection
    that turns out lost (the server restarted since) fails its first statement at once;
    the reader's pool is then emptied and the read runs again on a new one. None: any
    other database (SQLite reads a file in this process: nothing to save)."""
    if make_url(url).get_backend_name() != "postgresql":
        return None
    engine = create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_size=READER_POOL,
        pool_timeout=POOL_TIMEOUT_S,
        connect_args=_connect_args(),
    )
    WAIT_BOUND.guard(engine, WAIT_BOUND_S, PING_BOUND_S)
    _listen(engine)
    return engine


def _connect_args() -> dict[str, Any]:
    return {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": "gpusched",
        **TCP_SETTINGS,
    }


# COMMITs this thread has sent (whether answered or not): a request that fails once one
# was sent cannot say "nothing was changed" (`unavailable`).
_COMMITS = threading.local()


def _committing(_conn: Connection) -> None:
    _COMMITS.sent = commits_sent() + 1


def commits_sent() -> int:
    """How many COMMITs this thread has sent so far: read before and after a request."""
    return int(getattr(_COMMITS, "sent", 0))


def _answered(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
    DATABASE_OUTAGE.answered(statement)


def _reads_only(statement: str | None) -> bool:
    """Whether the statement only reads: one that takes no lock a write can hold."""
    if statement is None:
        return False
    words = " ".join(statement.upper().split())
    if words in ("BEGIN", "BEGIN DEFERRED") or words.startswith("PRAGMA"):
        return True
    takes_lock = any(lock in words for lock in (" FOR UPDATE", " FOR SHARE", "LOCK"))
    return words.startswith(("SELECT", "WITH")) and not takes_lock


def _make_engine(url: str, write_wait_s: float) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):  # one connection, SQLAlchemy's own pool
            engine = create_engine(url)
        else:
            engine = create_engine(
                url,
                pool_size=SQLITE_POOL,
                max_overflow=SQLITE_OVERFLOW,
                pool_timeout=write_wait_s,
            )
        _sqlite_setup(engine, write_wait_s)
        return engine
    if parsed.get_backend_name() != "postgresql":
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(
        url, pool_pre_ping=True, pool_timeout=POOL_TIMEOUT_S, connect_args=_connect_args()
    )
    WAIT_BOUND.guard(engine, WAIT_BOUND_S, PING_BOUND_S)
    return engine


def unavailable(exc: DBAPIError, where: str, committed: bool = False) -> GpuschedError:
    """One line for a person: the database (no password) and the driver's first line.
    `committed`: the failed request had sent a COMMIT (its answer lost, or an earlier
    write of the same request applied), so what it asked may have been done in part. A
    full disk is an answer, whatever was sent: nothing was changed."""
    first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
    if is_disk_full(exc):
        return GpuschedError(
            f"the database {where} cannot write: its disk is full; nothing was changed"
        )
    outcome = MAY_HAVE_BEEN_DONE if committed else NOTHING_CHANGED
    return GpuschedError(f"the database {where} is unavailable ({first}); {outcome}")


# SQLite's "database or disk is full"; PostgreSQL's disk_full (SQLSTATE 53100).
SQLITE_FULL = 13
PG_DISK_FULL = "53100"


def is_pool_exhausted(exc: BaseException) -> bool:
    """Whether `exc` is the pool's "no connection free within its timeout"."""
    return isinstance(exc, PoolTimeout)


def busy(where: str) -> GpuschedError:
    """A request refused for want of a free connection, in one line."""
    return GpuschedError(
        f"the database {where} is busy: no connection came free in time; nothing was changed"
    )


def is_disk_full(exc: BaseException) -> bool:
    """Whether a database error says its disk is full: an answer, so nothing was applied
    (a failed commit leaves SQLite's database as it was; PostgreSQL's aborts)."""
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlite_errorcode", None) == SQLITE_FULL:
        return True
    if getattr(orig, "sqlstate", None) == PG_DISK_FULL:
        return True
    return "database or disk is full" in str(orig)


def is_disconnect(exc: BaseException) -> TypeGuard[DBAPIError]:
    """Whether `exc` says the database cannot be reached or cannot answer now (rather than
    a bad statement): the connection lost, or any error of the driver's OperationalError
    or InterfaceError family (refused, timed out, reset, the server shutting down, a
    statement or lock wait cancelled by the server's timeouts, SQLite's "locked").

    SQLAlchemy wraps each driver error in the class of its nearest DB-API ancestor
    (psycopg.errors.ConnectionTimeout is an OperationalError), so the family is tested on
    the wrapper, not by the driver class's name.
    """
    if not isinstance(exc, DBAPIError):
        return False
    return exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))


class DatabaseOutage(logging.Filter):
    """The daemon's records of a database outage: one line when it begins, one at its end."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._since: float | None = None
        self._dropped = 0
        # A write that waited past its bound fails while reads go on (SQLite's WAL,
        # PostgreSQL's row locks): only a write that runs again ends that outage.
        self._writes_failed = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not is_disconnect(exc):
            return True
        with self._lock:
            if self._since is not None:
                self._dropped += 1
                return False
            self._since = time.monotonic()
            self._writes_failed = not _reads_only(getattr(exc, "statement", None))
        first = (
            str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
        )
        said = record.getMessage()  # before msg and args change
        record.msg = "%s: the database is unavailable (%s); %s"
        record.args = (said, first, "tried again every pass, said again when it answers")
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

    def answered(self, statement: str | None = None) -> None:
        """A statement ran: the outage is over, unless writes failed and it only read.
        Without a statement (a test's reset), over."""
        if self._since is None:  # the usual case: one read, no lock
            return
        if self._writes_failed and statement is not None and _reads_only(statement):
            return
        with self._lock:
            if self._since is None:
                return
            away, dropped = time.monotonic() - self._since, self._dropped
            self._since, self._dropped = None, 0
        log.warning(
            "the database answers again after %.0f s (%d failures not shown)", away, dropped
        )


DATABASE_OUTAGE = DatabaseOutage()  # on the daemon's log handler (gpusched.daemon.logfmt)


def _sqlite_setup(engine: Engine, write_wait_s: float) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE for every transaction (the pysqlite recipe).
    A write's busy timeout is what is left of its bound after its turn came
    (execution option `gpusched_busy_ms`, set by Database.write)."""
    busy_ms = int(write_wait_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED, which can
        # fail with "database is locked" at the first write instead of waiting.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writes take the write lock up front; reads take none (WAL readers never block
        # writers), so a slow status or history cannot make a submit wait.
        options = connection.get_execution_options()
        if options.get("gpusched_read", False):
            connection.exec_driver_sql("BEGIN")
            return
        # The level sticks to the pooled connection: set it only when it changes.
        wanted = "NORMAL" if options.get("gpusched_relaxed", False) else "FULL"
        if connection.info.get("synchronous", "FULL") != wanted:
            connection.exec_driver_sql(f"PRAGMA synchronous={wanted}")
            connection.info["synchronous"] = wanted
        left_ms = int(options.get("gpusched_busy_ms", busy_ms))
        if connection.info.get("busy_ms", busy_ms) != left_ms:
            connection.exec_driver_sql(f"PRAGMA busy_timeout={left_ms}")
            connection.info["busy_ms"] = left_ms
        connection.exec_driver_sql("BEGIN IMMEDIATE")
