"""What one `status` page reads (issue 30: `status` on PostgreSQL at most 1.5x SQLite).

A page and its counts are one statement (gpusched.store.active_page), on PostgreSQL read
through the reader (store.engine.make_reader): no BEGIN, no ROLLBACK, no test of the
connection, and a connection found lost (the server restarted) read again on a new one.
On SQLite and PostgreSQL (the `store` fixture); counted by the statements sent, never timed
(benchmarks/database.py times them). Nothing is cached between reads: every read sees what
another store (another daemon, another node) wrote just before.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, select

from gpusched.core.models import ACTIVE_STATES, JobState
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.store import Store
from gpusched.store.active_page import CHUNK
from gpusched.store.schema import jobs
from tests.fakes import GiB
from tests.postgres import PostgresServer
from tests.test_store import NOW, end, new_job, start
from tests.world import make_cluster, make_world

ROOT = Caller(pid=103, uid=0, gid=0, user="root", admin=True)


def _statements(store: Store) -> Generator[list[str], None, None]:
    """The statements `store` sends (on either engine) while the generator is open."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    engines = [store.database.engine]
    if store.database._reader is not None:
        engines.append(store.database._reader)
    for engine in engines:
        event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", note)


@pytest.fixture
def sent(store: Store) -> Iterator[list[str]]:
    yield from _statements(store)


def _page(store: Store, after: int, limit: int, **kw: Any) -> tuple[dict[str, int], list[int]]:
    def read() -> tuple[dict[str, int], list[int]]:
        page = store.jobs.active_page(after, limit, **kw)
        return page.counts, [job.id for job in page.jobs]

    return store.database.snapshot(read)


def test_a_page_and_its_counts_are_one_statement(store: Store, sent: list[str]) -> None:
    ids = [store.jobs.add(new_job(), NOW).id for _ in range(4)]
    assert start(store, ids[0])
    store.jobs.hold(ids[1])
    before = len(sent)
    counts, page = _page(store, 0, 10)
    assert page == ids
    assert counts == {"held": 1, "queued": 2, "running": 1}
    reads = [s for s in sent[before:] if not s.startswith("BEGIN")]  # SQLite's, in-process
    assert len(reads) == 1, reads


def test_a_status_reply_reads_the_jobs_in_two_statements(tmp_path: Path) -> None:
    """The handler: the page and its counts in one, the running jobs (this server's cards)
    in the other. It was four: the page's ids, their rows, the counts, the running jobs."""
    world = make_world(tmp_path, [24 * GiB])
    scheduler = world.scheduler
    try:
        for _ in range(3):
            world.submit(mem=4 * GiB)
        scheduler.tick()
        services = Services(scheduler, scheduler.store, scheduler.context.settings, 0)
        dispatch(services, ROOT, {"op": "status"})  # compiled once
        statements = _statements(scheduler.store)
        sent = next(statements)
        reply = dispatch(services, ROOT, {"op": "status"})
        reads = [s for s in sent if "FROM jobs" in s]
        statements.close()
        states = [job["state"] for job in reply["jobs"]]
        assert "running" in states
        assert reply["counts"] == {s: states.count(s) for s in ("held", "queued", "running")}
        assert len(reads) == 2, reads
    finally:
        scheduler.store.close()


def test_a_cluster_status_reply_is_one_statement(tmp_path: Path) -> None:
    """A cluster daemon's reply: the page, its counts and every node's report (its cards)
    in one statement. It was four: the page's ids, their rows, the nodes, the counts."""
    world = make_cluster(tmp_path, ["a", "b"], [24 * GiB])[0]
    scheduler = world.scheduler
    try:
        world.submit(mem=4 * GiB, allowed_nodes=("a",))
        scheduler.tick()
        services = Services(scheduler, scheduler.store, scheduler.context.settings, 0)
        expected = dispatch(services, ROOT, {"op": "status"})
        statements = _statements(scheduler.store)
        sent = next(statements)
        reply = dispatch(services, ROOT, {"op": "status"})
        reads = [s for s in sent if not s.startswith("BEGIN")]
        statements.close()
        assert [n["name"] for n in reply["nodes"]] == ["a", "b"]
        assert reply["nodes"] == expected["nodes"]
        assert reply["gpus"] == expected["gpus"]
        assert len(reads) == 1, reads
    finally:
        scheduler.store.close()


@pytest.mark.parametrize("fixed_clock", [False, True])
def test_the_nodes_read_with_a_page_are_those_read_alone(
    database_url: str, fixed_clock: bool
) -> None:
    """By the database's clock, and by a test's fixed one (the store's lease_clock)."""
    store = Store(database_url, lease_clock=(lambda: 1.7e9) if fixed_clock else None)
    try:
        for name in ("b", "a"):
            epoch = store.nodes.claim_node(name, f"{name}:1", 30.0, None)
            assert store.nodes.renew_node(name, epoch, 30.0, {"reports": [], "name": name})
        alone = store.nodes.node_rows()
        page = store.database.snapshot(lambda: store.jobs.active_page(0, 10, with_nodes=True))
        assert page.nodes is not None
        assert [r.name for r in page.nodes] == [r.name for r in alone] == ["a", "b"]
        for read, expected in zip(page.nodes, alone, strict=True):
            assert (read.epoch, read.state, read.owner, read.drain_reason, read.report) == (
                expected.epoch,
                expected.state,
                expected.owner,
                expected.drain_reason,
                expected.report,
            )
            assert read.expired == expected.expired
            assert abs(read.age_s - expected.age_s) < 5
        assert store.database.snapshot(lambda: store.jobs.active_page(0, 10)).nodes is None
    finally:
        store.close()


def test_on_postgresql_a_page_is_read_outside_a_transaction(store: Store) -> None:
    """No BEGIN before it and no ROLLBACK after it: each is a round trip to the server."""
    if store.database._reader is None:
        pytest.skip("SQLite reads a file in this process: a transaction costs no round trip")
    store.jobs.add(new_job(), NOW)

    def read() -> Any:
        list(store.jobs.active_page(0, 10).jobs)
        with store.database.read() as conn:
            return conn.connection.driver_connection.info.transaction_status  # type: ignore[union-attr]

    assert store.database.snapshot(read) == psycopg.pq.TransactionStatus.IDLE


def test_a_page_longer_than_a_chunk_is_read_in_order(store: Store) -> None:
    """Past its first chunk a page reads on from the last id it was given: the same jobs,
    in id order, as the page's filter says, and the counts of every page."""
    n = CHUNK * 2 + 50
    ids = [job.id for job in store.jobs.add_many([new_job()] * n, NOW)]
    bob = [store.jobs.add(new_job(user="bob"), NOW).id for _ in range(3)]
    held = ids[CHUNK + 7]
    store.jobs.hold(held)
    queued = [i for i in ids if i != held]
    counts, page = _page(store, 0, n + 10, states={JobState.QUEUED}, user="alice")
    assert page == queued
    assert counts == {"held": 1, "queued": n - 1, "running": 0}
    counts, page = _page(store, ids[10], CHUNK + 20)
    assert page == ids[11 : 11 + CHUNK + 20]
    counts, page = _page(store, ids[-1], 10, user="bob")
    assert page == bob
    assert counts == {"held": 0, "queued": 3, "running": 0}
    everything = select(jobs.c.id).where(jobs.c.state.in_([str(s) for s in ACTIVE_STATES]))
    with store.database.read() as conn:
        assert _page(store, 0, 10**6)[1] == sorted(conn.execute(everything).scalars())


def test_each_read_sees_another_stores_writes(store: Store, database_url: str) -> None:
    """Nothing of a page is kept between reads (not its rows, not its counts): a change
    made by another daemon just before is in the next page."""
    first = store.jobs.add(new_job(), NOW).id
    assert _page(store, 0, 10) == ({"held": 0, "queued": 1, "running": 0}, [first])
    other = Store(database_url)
    try:
        second = other.jobs.add(new_job(), NOW).id
        assert _page(store, 0, 10) == ({"held": 0, "queued": 2, "running": 0}, [first, second])
        other.jobs.hold(first)
        assert start(other, second)
        assert _page(store, 0, 10) == ({"held": 1, "queued": 0, "running": 1}, [first, second])
        assert end(other, second)
        assert _page(store, 0, 10) == ({"held": 1, "queued": 0, "running": 0}, [first])
    finally:
        other.close()


def test_a_reading_connection_lost_is_read_again(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    """The reader does not test a connection before use: one that the server closed since
    (a restart, an administrator) fails its first statement, and the read runs again on a
    new connection instead of failing the request."""
    store = Store(postgres_url)
    try:
        job = store.jobs.add(new_job(), NOW).id
        assert _page(store, 0, 10)[1] == [job]
        database = postgres_url.split("?", maxsplit=1)[0].rsplit("/", 1)[1]
        with postgres_server.admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
        assert _page(store, 0, 10) == ({"held": 0, "queued": 1, "running": 0}, [job])
    finally:
        store.close()


def test_a_read_that_fails_for_another_reason_is_not_repeated(store: Store) -> None:
    calls: list[int] = []

    def work() -> None:
        calls.append(1)
        with store.database.read() as conn:
            conn.exec_driver_sql("SELECT no_such_column FROM jobs")

    with pytest.raises(Exception, match="no_such_column"):
        store.database.snapshot(work)
    assert calls == [1]
