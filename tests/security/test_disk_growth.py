"""Nothing a job leaves grows without bound (issue 27, items 2 and 3).

Before: every started job left `state_dir/jobs/ID/spec.json`, a copy of its whole
environment, for good (a 2,000-job sweep with a 240 KiB environment wrote 472 MiB as
root); and submit-then-cancel with a new 240 KB environment each time grew the database
by 578 MB a minute, `max_queued` notwithstanding. Now the supervisor deletes the spec as
soon as it has read it, the retention pass (here every second) removes each ended job's
directory and the environments of ended jobs past `retention.environments`, and a
per-user budget of bytes stored refuses submits past it with one line.

Stated growth: after a 200-job sweep with a 200 KiB environment has ended, the jobs
directory holds under 256 KiB (was 40 MB); a second round of 30 submit-and-cancel with
new 200 KiB environments adds under 2 MiB to the database once the first round's
environments are deleted (each round stores 6 MB).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.client import Client
from gpusched.core.errors import GpuschedError
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user

KiB, MiB = 2**10, 2**20


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _db_bytes(daemon: RunningDaemon) -> int:
    """The database's size on disk once its write-ahead log is folded back: the WAL is
    working space (SQLite checkpoints it every 1000 pages, and a reader at that instant
    lets it grow past that for a while), the data kept is the database file."""

    def folded() -> bool:
        conn = sqlite3.connect(daemon.root / "gpusched.db", timeout=5)
        try:
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
        return busy == 0

    eventually(folded, timeout=30)
    return sum(p.stat().st_size for p in daemon.root.glob("gpusched.db*") if p.is_file())


def _stored_envs(daemon: RunningDaemon) -> int:
    conn = sqlite3.connect(f"file:{daemon.root / 'gpusched.db'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM envs").fetchone()[0])
    finally:
        conn.close()


def _big_env(tag: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", **{f"V{i}": tag + "e" * 1000 for i in range(200)}}


def _submit_raw(daemon: RunningDaemon, user: User, **args: Any) -> Any:
    sock = daemon.socket_path
    request = {"cwd": user.home, "umask": 0o022, "mem": 2**30, **args}
    return as_user(user, lambda: Client(sock, timeout_s=60).request("submit", **request))


def test_a_sweeps_jobs_leave_no_spec_and_no_directory(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon(retention={"every": "1s"})
    jobs_dir = daemon.root / "jobs"
    env = _big_env("s")
    jobs = _submit_raw(
        daemon,
        mallory,
        command=["true", "{i}"],
        env=env,
        sweep=[["i", [str(i) for i in range(200)]]],
    )
    assert len(jobs) == 200
    eventually(
        lambda: all(j["state"] == "done" for j in daemon.status("--all")["jobs"]),
        timeout=180,
        interval=1,
    )
    eventually(
        lambda: _tree_bytes(jobs_dir) < 256 * KiB,
        timeout=30,
        describe=lambda: f"{_tree_bytes(jobs_dir)} bytes in {jobs_dir}",
    )
    assert not list(jobs_dir.glob("*/spec.json"))


def test_a_running_jobs_spec_is_deleted_once_read(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """The environment (tokens) is on disk only until the supervisor has read it."""
    mallory, _victim = people
    daemon = root_daemon()
    job = _submit_raw(daemon, mallory, command=["sleep", "60"], env={"TOKEN": "secret-123"})
    daemon.supervisor_pid(job["id"])
    job_dir = daemon.root / "jobs" / str(job["id"])
    eventually(lambda: not (job_dir / "spec.json").exists(), timeout=10)
    found = [p for p in job_dir.rglob("*") if p.is_file() and b"secret-123" in p.read_bytes()]
    assert found == []
    daemon.cli("cancel", str(job["id"]))


def test_submit_then_cancel_with_new_environments_is_bounded(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon(
        retention={"every": "1s", "environments": "1s", "user_bytes_per_minute": "16M"}
    )

    def round_of(tag: str) -> None:
        for n in range(30):
            job_id = int(
                _submit_raw(
                    daemon, mallory, command=["true"], env=_big_env(f"{tag}{n}"), hold=True
                )["id"]
            )

            def cancel(job_id: int = job_id) -> bool:
                return bool(Client(daemon.socket_path).cancel(job_id))

            as_user(mallory, cancel)

    round_of("a")
    eventually(lambda: _stored_envs(daemon) == 0, timeout=30, describe=lambda: _stored_envs(daemon))
    after_first = _db_bytes(daemon)
    round_of("b")
    eventually(lambda: _stored_envs(daemon) == 0, timeout=30, describe=lambda: _stored_envs(daemon))
    assert _db_bytes(daemon) - after_first < 2 * MiB
    # A cancelled job's requeue needs its environment: refused, once it is deleted.
    ended = daemon.status("--all")["jobs"][0]
    refused = daemon.cli("requeue", str(ended["id"]))
    assert refused.returncode != 0 and "environment was deleted" in refused.stderr


def test_a_users_stored_bytes_per_minute_are_capped(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon(retention={"user_bytes_per_minute": "4M"})
    refused = None
    for n in range(40):  # 40 x 210 KB = 8.4 MB, twice the budget
        try:
            job = _submit_raw(daemon, mallory, command=["true"], env=_big_env(f"m{n}"), hold=True)
        except GpuschedError as exc:
            refused = (n, exc.message)
            break
        assert job["state"] == "held"
    assert refused is not None, "40 new 210 KB environments in a minute were all stored"
    n, message = refused
    assert 15 <= n <= 20, refused  # 4 MiB / 210 KB
    assert "\n" not in message and "retention.user_bytes_per_minute" in message
    # The same environment again is stored once: it costs only its command.
    same = _big_env("m0")
    for _ in range(5):
        with_same = _submit_raw(daemon, mallory, command=["true"], env=same, hold=True)
        assert with_same["state"] == "held"
    # Another user has their own budget.
    theirs = _submit_raw(daemon, victim, command=["true"], env=_big_env("v"), hold=True)
    assert theirs["state"] == "held"
