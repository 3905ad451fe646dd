"""The daemon's own threads never refuse each other on SQLite: a write waits its turn in
the process (gpusched.store.turns) within the stated bound instead of failing when
SQLite's busy timeout runs out, and many reads at once are served together, never
refused for want of a pooled connection.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gpusched.store import Store
from gpusched.store.engine import WRITE_WAIT_S, is_disconnect, unavailable
from tests.test_store import NOW, new_job

# Longer than the busy timeout SQLite was given before (10 s), well inside the bound.
HELD_S = 11.0


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store
    store.close()


def test_a_write_waits_for_another_thread_s_long_write(sqlite_store: Store) -> None:
    assert WRITE_WAIT_S > HELD_S
    holding = threading.Event()

    def hold_the_write_lock() -> None:
        with sqlite_store.database.write() as conn:
            conn.execute(text("SELECT 1"))
            holding.set()
            time.sleep(HELD_S)

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    assert holding.wait(10)
    try:
        job = sqlite_store.jobs.add(new_job(), NOW)  # waits its turn, then commits
    finally:
        holder.join()
    assert sqlite_store.jobs.get(job.id).id == job.id


def test_many_reads_at_once_are_served_together(sqlite_store: Store) -> None:
    """40 replies reading at the same moment (the default pool held 15 connections: the
    16th waited 30 s, then failed with an internal error)."""
    readers = 40
    inside = threading.Barrier(readers, timeout=20)
    failures: list[BaseException] = []

    def read() -> None:
        def work() -> int:
            count = len(sqlite_store.jobs.active())
            inside.wait()  # every reader holds its connection here at once
            return count

        try:
            sqlite_store.database.snapshot(work)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_another_process_holding_the_database_is_said_in_one_line(tmp_path: Path) -> None:
    """What is refused is refused for a reason outside the daemon: here another process's
    connection holds the write lock past the bound (shortened for the test)."""
    path = tmp_path / "jobs.db"
    store = Store(f"sqlite:///{path}", write_wait_s=1.0)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(DBAPIError) as raised:
            store.jobs.add(new_job(), NOW)
        assert time.monotonic() - started < 10
        assert is_disconnect(raised.value)
        said = unavailable(raised.value, store.where).message
        assert "database is locked" in said
        assert "\n" not in said
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()
