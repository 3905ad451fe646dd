"""Every way the database can fail to answer is told apart from a bad statement, and said
in one line (gpusched.store.engine's is_disconnect and unavailable): issue 26, items 1, 3.

Each case makes the real error against the private PostgreSQL (tests/postgres.py), with
the server-side bounds docs/cluster.md sets, through the daemon's own engine (make_engine),
where needed behind the fault proxy (tests/faultproxy.py). Before, only the driver classes
named exactly OperationalError or InterfaceError counted: a connect timeout
(psycopg.errors.ConnectionTimeout), a statement or a lock wait cancelled by the server
(QueryCanceled, LockNotAvailable) and a server shutting down (AdminShutdown) showed as
"internal error: ..." with a traceback.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from gpusched.core.errors import GpuschedError
from gpusched.store import Store
from gpusched.store.engine import WAIT_BOUND_S, is_disconnect, make_engine, unavailable
from tests.faultproxy import FaultProxy
from tests.postgres import PostgresServer

Fault = Callable[["Setup"], None]


class Setup:
    def __init__(self, server: PostgresServer, database: str, proxy: FaultProxy) -> None:
        self.server = server
        self.database = database
        self.proxy = proxy
        self.engine: Engine = make_engine(server.tcp_url(database, proxy.port))

    def run(self, statement: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(statement))


@pytest.fixture
def setup(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    monkeypatch.setenv("PGPASSWORD", postgres_server.password)
    database = postgres_server.create_database()
    proxy = FaultProxy(postgres_server.port)
    made = Setup(postgres_server, database, proxy)
    try:
        yield made
    finally:
        proxy.heal()
        made.engine.dispose()
        proxy.close()
        postgres_server.drop_database(database)


def connect_timeout(s: Setup) -> None:  # psycopg.errors.ConnectionTimeout
    s.proxy.blackhole()
    s.run("SELECT 1")


def no_answer(s: Setup) -> None:  # an open connection, then silence: WaitBound ends it
    with s.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        s.proxy.blackhole()
        conn.execute(text("SELECT 2"))


def reset(s: Setup) -> None:
    with s.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        s.proxy.reset()
        conn.execute(text("SELECT 2"))


def refused(s: Setup) -> None:
    s.proxy.close()  # nothing listens at its port any more
    s.run("SELECT 1")


def statement_timeout(s: Setup) -> None:  # QueryCanceled
    s.run("SELECT pg_sleep(30)")


def lock_timeout(s: Setup) -> None:  # LockNotAvailable
    s.run("CREATE TABLE t (x int)")
    holder = make_engine(s.server.tcp_url(s.database))  # straight to the server
    try:
        with holder.begin() as conn:
            conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
            conn.execute(text("LOCK TABLE t"))
            s.run("INSERT INTO t VALUES (1)")
    finally:
        holder.dispose()


def idle_in_transaction(s: Setup) -> None:  # the server ends a transaction left open
    with s.engine.begin() as conn:
        conn.execute(text("SELECT 1"))
        time.sleep(3)  # more than the database's idle_in_transaction_session_timeout (2 s)
        conn.execute(text("SELECT 2"))


def terminated(s: Setup) -> None:  # AdminShutdown: pg_terminate_backend, a restart
    with s.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        with s.server.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (s.database,),
            )
        conn.execute(text("SELECT 2"))


FAULTS: dict[str, Fault] = {
    "connect timeout": connect_timeout,
    "no answer": no_answer,
    "connection reset": reset,
    "connection refused": refused,
    "statement timeout": statement_timeout,
    "lock timeout": lock_timeout,
    "idle in transaction": idle_in_transaction,
    "backend terminated": terminated,
}


def raised(fault: Fault, s: Setup) -> DBAPIError:
    with pytest.raises(DBAPIError) as caught:
        fault(s)
    return caught.value


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_way_the_database_fails_is_one_line_saying_it_is_unavailable(
    setup: Setup, name: str
) -> None:
    exc = raised(FAULTS[name], setup)
    assert is_disconnect(exc), f"{type(exc.orig).__module__}.{type(exc.orig).__name__}: {exc}"
    message = unavailable(exc, "postgresql+psycopg://x@db/q").message
    assert "\n" not in message
    assert message.startswith("the database postgresql+psycopg://x@db/q is unavailable (")
    assert message.endswith("); nothing was changed")


def test_a_silent_database_is_given_up_after_the_bound_and_the_engine_recovers(
    setup: Setup,
) -> None:
    setup.run("SELECT 1")
    setup.proxy.blackhole()
    result: dict[str, BaseException] = {}

    def ask() -> None:
        try:
            setup.run("SELECT 1")
        except BaseException as exc:  # handed to the test's thread
            result["exc"] = exc

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join(timeout=60)  # without the bound it would wait for as long as the partition
    assert not asker.is_alive(), "a request waited on a silent database past 60 s"
    assert isinstance(result.get("exc"), DBAPIError) and is_disconnect(result["exc"])
    assert "no answer from the database within" in str(result["exc"]) or "timeout" in str(
        result["exc"]
    )
    setup.proxy.heal()
    setup.run("SELECT 1")  # new connections, no restart


def test_both_sides_bound_their_waits(setup: Setup) -> None:
    with setup.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        client = raw.info.get_parameters()
        server = {
            name: conn.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout")
        }
    # The client: libpq's keepalives and tcp_user_timeout, as make_engine sets them.
    assert client["keepalives_idle"] == "5" and client["tcp_user_timeout"] == "10000", client
    assert setup.engine.pool.timeout() <= WAIT_BOUND_S  # type: ignore[attr-defined]
    # The server: the database's settings of docs/cluster.md section 1 (tests' scale).
    assert server == {
        "idle_in_transaction_session_timeout": "2s",
        "lock_timeout": "2s",
        "statement_timeout": "4s",
    }


def test_bad_statements_and_conflicts_are_not_called_an_outage(setup: Setup) -> None:
    for statement in ("SELEC 1", "SELECT * FROM no_such_table", "SELECT 1/0"):
        with pytest.raises(DBAPIError) as caught:
            setup.run(statement)
        assert not is_disconnect(caught.value), caught.value


def test_a_locked_sqlite_database_is_one_line_too(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    Store(f"sqlite:///{path}").close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA busy_timeout=0")
    holder.execute("BEGIN EXCLUSIVE")
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect().execution_options(gpusched_read=True) as conn:  # no write lock
            conn.exec_driver_sql("PRAGMA busy_timeout=100")  # not 10 s: the pooled connection
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs"))
    finally:
        holder.close()
        engine.dispose()
    assert is_disconnect(caught.value)
    assert isinstance(unavailable(caught.value, "q.db"), GpuschedError)
