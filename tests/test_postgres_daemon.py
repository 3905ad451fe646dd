"""A daemon whose `database:` is PostgreSQL (the tests' private server), end to end.

A job runs and its history survives a daemon restart; the URL's password never reaches the
logs or a client; and the database going away loses nothing: a submit meanwhile gets one
line naming the database, the running job goes on, and its end is recorded once the
server is back, the daemon having reconnected by itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually, job_until
from tests.postgres import PostgresServer

# The test server trusts its socket: any password passes.
PASSWORD = "hunter2-not-for-logs"  # noqa: S105


def _with_password(url: str) -> str:
    user, rest = url.split("@", 1)
    return f"{user}:{PASSWORD}@{rest}"


@pytest.fixture
def pg_daemon(daemon_factory: Any, postgres_url: str) -> RunningDaemon:
    daemon: RunningDaemon = daemon_factory(config={"database": _with_password(postgres_url)})
    daemon.config_path.chmod(0o600)  # it holds a password: readable by root only
    return daemon.start()


@pytest.fixture
def server_restored(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """The session's server, started again after the test whatever happened in it."""
    yield postgres_server
    if not postgres_server.running:
        postgres_server.start()


def test_a_job_runs_and_its_history_survives_a_restart(pg_daemon: RunningDaemon) -> None:
    job_id = pg_daemon.submit("--mem", "1G", "--", "sh", "-c", "echo hello; exit 3")
    assert pg_daemon.cli("wait", str(job_id), timeout=60).returncode == 3
    before = pg_daemon.show(job_id)
    assert (before["state"], before["exit_code"]) == ("failed", 3)

    pg_daemon.stop()
    pg_daemon.start()

    assert pg_daemon.show(job_id) == before
    history = pg_daemon.cli("history", "--json")
    assert history.returncode == 0, history.stderr
    assert str(job_id) in history.stdout
    assert "hello" in pg_daemon.log(job_id)
    assert pg_daemon.submit("--mem", "1G", "--", "true") > job_id  # ids carry on
    assert PASSWORD not in pg_daemon.stderr()
    assert "database postgresql+psycopg://postgres@/test_" in pg_daemon.stderr()


def test_a_password_in_a_config_file_others_can_read_is_refused(
    daemon_factory: Any, postgres_url: str
) -> None:
    daemon: RunningDaemon = daemon_factory(config={"database": _with_password(postgres_url)})
    daemon.config_path.chmod(0o644)
    with pytest.raises(RuntimeError) as refused:
        daemon.start()
    lines = daemon.stderr().strip().splitlines()
    assert "holds a password but the file is readable by others (mode 644)" in lines[-1]
    assert PASSWORD not in daemon.stderr()
    assert "daemon exited" in str(refused.value)


def test_the_database_going_away_loses_nothing(
    pg_daemon: RunningDaemon, server_restored: PostgresServer, tmp_path: Path
) -> None:
    go, marker = tmp_path / "go", tmp_path / "ran"
    job_id = pg_daemon.submit("--mem", "1G", "--", "python3", "-c", job_until(go, marker, 5))
    pg_daemon.wait_state(job_id, {"running"})

    server_restored.stop("fast")

    refused = pg_daemon.cli("submit", "--mem", "1G", "--", "true")
    assert refused.returncode != 0
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "the database postgresql+psycopg://postgres@/test_" in line, line
    assert "unavailable" in line
    assert PASSWORD not in line
    # The job goes on, and ends, while the database is away.
    go.touch()
    eventually(marker.exists, 30)
    eventually(
        lambda: "its end is recorded once it can be" in pg_daemon.stderr(),
        30,
        describe=pg_daemon.stderr,
    )

    server_restored.start()

    def ended() -> dict[str, Any] | None:
        shown = pg_daemon.cli("show", "--json", str(job_id))
        if shown.returncode != 0:
            return None
        seen: dict[str, Any] = json.loads(shown.stdout)
        return seen if seen["state"] == "failed" else None

    job = eventually(ended, 30, describe=pg_daemon.stderr)
    assert job is not None
    assert (job["reason"], job["exit_code"]) == ("exit", 5)
    # The daemon reconnected by itself: it takes and runs new jobs.
    again = pg_daemon.submit("--mem", "1G", "--", "true")
    assert pg_daemon.cli("wait", str(again), timeout=60).returncode == 0
    assert PASSWORD not in pg_daemon.stderr()


def test_a_daemon_cannot_start_without_its_database_and_says_so(
    daemon_factory: Any, tmp_path: Path
) -> None:
    nowhere = f"postgresql+psycopg://gpusched:{PASSWORD}@/gpusched?host={tmp_path}&port=1"
    daemon: RunningDaemon = daemon_factory(config={"database": nowhere})
    daemon.config_path.chmod(0o600)
    with pytest.raises(RuntimeError):
        daemon.start()
    last = daemon.stderr().strip().splitlines()[-1]
    assert f"the database postgresql+psycopg://gpusched@/gpusched?host={tmp_path}&port=1" in last
    assert "is unavailable (connection" in last
    assert PASSWORD not in daemon.stderr()
    assert "Traceback" not in daemon.stderr()
