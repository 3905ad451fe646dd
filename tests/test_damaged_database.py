"""A damaged SQLite database: the daemon refuses it in one line that names the file, what
is wrong and the documented restore; an empty file is a new queue only before any run.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def _random(db: Path) -> None:
    db.write_bytes(os.urandom(db.stat().st_size))


def _header(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(b"\xff" * 100 + data[100:])


def _zeroed_page(db: Path) -> None:
    """The page that holds the root of the jobs table, zeroed."""
    conn = sqlite3.connect(db)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    finally:
        conn.close()
    with open(db, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\0" * page_size)


def _text(db: Path) -> None:
    db.write_text("name,state\ntrain,done\n")


def _empty(db: Path) -> None:
    db.write_bytes(b"")


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncated,
    "random bytes": _random,
    "overwritten header": _header,
    "zeroed page": _zeroed_page,
    "a text file": _text,
    "zero-length": _empty,
}


def refusal(daemon: RunningDaemon) -> str:
    """The one line a daemon that refused to start said (and that it said nothing else)."""
    with pytest.raises(RuntimeError, match="daemon exited 1"):
        daemon.start()
    said = daemon.stderr()
    assert "Traceback" not in said, said
    errors = [line for line in said.splitlines() if line.startswith("gpusched:")]
    assert len(errors) == 1, said
    return errors[0]


@pytest.fixture
def used_daemon(daemon_factory: Any) -> RunningDaemon:
    """A daemon that ran three jobs, stopped (its WAL folded into the database)."""
    daemon = daemon_factory().start()
    ids = [daemon.submit("--mem", "1G", "--", "true") for _ in range(3)]
    for job in ids:
        daemon.wait_state(job, {"done"})
    daemon.stop()
    for suffix in ("-wal", "-shm"):
        assert not (daemon.root / f"gpusched.db{suffix}").exists()
    return daemon


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_database_is_refused_in_one_line_with_the_restore(
    used_daemon: RunningDaemon, damage: str
) -> None:
    db = used_daemon.root / "gpusched.db"
    DAMAGES[damage](db)
    said = refusal(used_daemon)
    assert str(db) in said, said
    assert "Back up the database" in said and "operations.md" in said, said
    assert db.exists()  # kept as it was found, for a look or a repair


def test_an_empty_database_file_before_any_run_is_a_new_queue(daemon_factory: Any) -> None:
    """What a crash before the first migration leaves: the file, empty, and nothing else."""
    daemon = daemon_factory()
    (daemon.root / "gpusched.db").touch(mode=0o600)
    daemon.start()
    job = daemon.submit("--mem", "1G", "--", "true")
    assert job == 1
    eventually(lambda: daemon.show(job)["state"] == "done", 20)
