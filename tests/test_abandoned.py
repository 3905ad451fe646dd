"""A PostgreSQL backend its daemon abandoned in the middle of a pipeline (issue 26):
ended once it has waited on its client long enough, and only such a backend
(gpusched.store.abandoned), on a real private server.

The abandoned one is made as a partition makes it: a transaction updates a job's row,
then sends a pipeline's Bind and Execute with no Sync; the server then counts it neither
idle in a transaction nor running a statement, and its server-side bounds never end it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gpusched.core.models import JobState
from gpusched.store import Store
from gpusched.store.abandoned import ABANDONED_AFTER_S, CHECK_EVERY_S, end_abandoned
from tests.fakes import GiB
from tests.test_store import NOW, new_job, start
from tests.world import make_cluster


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    s = Store(postgres_url)
    yield s
    s.close()


def _libpq(store: Store) -> psycopg.Connection[tuple[object, ...]]:
    """A connection of the daemons' role (the store's own URL), in a transaction."""
    url = store.database.engine.url.set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False))


def _update_row(store: Store, job_id: int) -> str:
    try:
        with store.database.engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '1s'"))
            conn.execute(
                text("UPDATE jobs SET waiting_reason = 'x' WHERE id = :id"), {"id": job_id}
            )
    except OperationalError as exc:
        return f"blocked: {exc.orig.__class__.__name__}"
    return "updated"


def test_a_backend_abandoned_mid_pipeline_is_ended_and_its_row_freed(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    start(store, job_id)
    rogue = _libpq(store)
    try:
        rogue.execute("UPDATE jobs SET waiting_reason = 'held' WHERE id = %s", (job_id,))
        pid = rogue.pgconn.backend_pid
        rogue.pgconn.enter_pipeline_mode()  # a pipeline's first message, no Sync: cut
        rogue.pgconn.send_query_params(b"SELECT 1", None)
        rogue.pgconn.send_flush_request()
        rogue.pgconn.flush()
        time.sleep(2.5)  # past the test server's idle-in-transaction bound (2 s)
        assert _update_row(store, job_id) == "blocked: LockNotAvailable"  # nothing ended it
        with store.database.read() as conn:
            assert end_abandoned(conn, older_than_s=60) == []  # not waiting long enough yet
            assert end_abandoned(conn, older_than_s=2) == [pid]
        assert _update_row(store, job_id) == "updated"
    finally:
        rogue.close()


def test_a_backend_running_a_statement_or_idle_is_not_ended(store: Store) -> None:
    busy, idle = _libpq(store), _libpq(store)
    try:
        idle.execute("SELECT 1")  # idle in a transaction: the server's own bound's
        busy.pgconn.send_query(b"SELECT pg_sleep(3)")  # running: not waiting on its client
        time.sleep(1.5)
        with store.database.read() as conn:
            assert end_abandoned(conn, older_than_s=1) == []
        assert busy.pgconn.get_result() is not None  # it ran to its end
    finally:
        busy.close()
        idle.close()


def test_a_pass_ends_the_backend_that_held_its_job_s_row(tmp_path: Path, postgres_url: str) -> None:
    """Wired into the pass, first thing: a node whose job ended cannot record the end while
    an abandoned backend holds the job's row (its pass fails on the lock, as every node's
    did for minutes in the randomized rounds); once that backend has waited on its client
    past the bound, the next pass ends it and records the end."""
    (a,) = make_cluster(tmp_path, ["a"], [24 * GiB], database=postgres_url)
    try:
        a.tick()
        job = a.submit(8 * GiB)
        a.tick()
        assert a.state(job) == JobState.RUNNING
        rogue = _libpq(a.scheduler.store)
        try:
            rogue.execute("UPDATE jobs SET waiting_reason = 'held' WHERE id = %s", (job,))
            rogue.pgconn.enter_pipeline_mode()
            rogue.pgconn.send_query_params(b"SELECT 1", None)
            rogue.pgconn.send_flush_request()
            rogue.pgconn.flush()
            cut_at = time.monotonic()
            a.finish(job)
            with pytest.raises(OperationalError, match="lock"):
                a.tick()  # the end cannot be written: the row is held
            time.sleep(max(0.0, ABANDONED_AFTER_S + 1 - (time.monotonic() - cut_at)))
            a.clock.advance(CHECK_EVERY_S)
            a.tick()
            assert a.state(job) == JobState.DONE
        finally:
            rogue.close()
    finally:
        a.scheduler.store.close()
