"""The daemon's outage lines (gpusched.store.engine's DatabaseOutage): the outage is said
to be over only once the kind of statement that failed runs again, never because a read
went through while another process still holds the write lock."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError

from gpusched.store import NewJob, Store
from gpusched.store.engine import DATABASE_OUTAGE

NOW = "2025-01-01T00:00:00.000+00:00"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


@pytest.fixture
def said() -> Iterator[list[str]]:
    """What the daemon's log handler lets through: every gpusched record, after the
    outage filter."""
    lines = Lines()
    lines.addFilter(DATABASE_OUTAGE)
    logger = logging.getLogger("gpusched")
    logger.addHandler(lines)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield lines.said
    logger.removeHandler(lines)
    logger.setLevel(old_level)
    DATABASE_OUTAGE.answered()  # no outage left open for the next test


def _job() -> NewJob:
    return NewJob(
        user="alice", uid=1000, gid=1000, command=["true"], cwd="/tmp",
        env={"PATH": "/usr/bin"}, umask=0o022, mem=2**30,
    )  # fmt: skip


def test_a_read_beside_a_held_write_lock_does_not_end_the_outage(
    tmp_path: Path, said: list[str]
) -> None:
    db = tmp_path / "gpusched.db"
    store = Store(f"sqlite:///{db}", write_wait_s=0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(DBAPIError) as failed:
            store.jobs.add(_job(), NOW)
        logging.getLogger("gpusched.scheduling").error("pass failed", exc_info=failed.value)
        assert "the database is unavailable" in said[-1], said
        assert store.jobs.count() == 0  # a read goes through: WAL readers never wait
        assert not [line for line in said if "answers again" in line], said
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.jobs.add(_job(), NOW)
    assert [line for line in said if "answers again" in line], said
    store.close()
