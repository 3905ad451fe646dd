"""Connections to the store's database, per dialect, and what to say when it is away.

SQLite (one server): WAL, a busy timeout and BEGIN IMMEDIATE for every write
transaction, so concurrent writers queue on the lock instead of failing half way.
PostgreSQL (a shared queue): psycopg 3, READ COMMITTED, a pool whose connections are
tested before use (pool_pre_ping), so that after the server restarts the daemon
reconnects by itself; a short connect timeout, so that a request fails in seconds, not
minutes, while it is away. Job-state changes are conditional UPDATEs on either
(gpusched.store.transitions), which READ COMMITTED re-checks after waiting on a row lock.

Whatever is said about a database names it without its password (`describe_url`).
"""

from __future__ import annotations

from typing import Any, TypeGuard
from urllib.parse import unquote

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from gpusched.core.errors import GpuschedError

# Seconds to wait for a PostgreSQL server before a request fails (libpq's connect_timeout).
CONNECT_TIMEOUT_S = 5


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


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url)
        _sqlite_setup(engine)
        return engine
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
        connect_args["application_name"] = "gpusched"
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def unavailable(exc: DBAPIError, where: str) -> GpuschedError:
    """One line for a person: the database (no password) and the driver's first line."""
    first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
    return GpuschedError(f"the database {where} is unavailable ({first}); nothing was changed")


def is_disconnect(exc: BaseException) -> TypeGuard[DBAPIError]:
    """Whether `exc` says the database cannot be reached (rather than a bad statement)."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    # psycopg raises OperationalError for a refused or lost connection.
    return type(exc.orig).__name__ in ("OperationalError", "InterfaceError")


def _sqlite_setup(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE for every transaction (the pysqlite recipe)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED, which can
        # fail with "database is locked" at the first write instead of waiting.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=10000")
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
        connection.exec_driver_sql("BEGIN IMMEDIATE")
