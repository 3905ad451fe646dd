"""A full disk under the daemon's files: nothing that ended or was queued is lost.

Each test mounts a small tmpfs of its own (root only: the suite runs as root in CI) for
the directories that fill; a job of the test's fills it, as a user's job would.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.processes.durable import (
    RECORD_BYTES,
    is_blank,
    reserve_record,
    write_json_atomically,
    write_record,
)
from tests.daemon_harness import RunningDaemon, eventually, job_until

FS_SIZE = "20m"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB tmpfs mounted for this test alone."""
    where = tmp_path / "fs"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_up(fs: Path) -> Path:
    """Fill `fs` to its last byte with one file; returns it."""
    fill = fs / "fill"
    with open(fill, "wb", buffering=0) as handle:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"x" * size)
    return fill


def test_a_reserved_record_is_written_on_a_full_disk_and_an_unreserved_one_is_not(
    small_fs: Path,
) -> None:
    reserved, unreserved = small_fs / "reserved.json", small_fs / "unreserved.json"
    reserve_record(reserved)
    assert reserved.stat().st_size == RECORD_BYTES and is_blank(reserved.read_bytes())
    fill_up(small_fs)
    write_record(reserved, {"outcome": "exit", "exit_code": 5})
    assert json.loads(reserved.read_bytes()) == {"outcome": "exit", "exit_code": 5}
    with pytest.raises(OSError, match="No space"):
        write_json_atomically(unreserved, {"outcome": "exit", "exit_code": 5})
    with pytest.raises(OSError, match="No space"):
        reserve_record(unreserved)
    assert not unreserved.exists()


def test_a_record_longer_than_its_reservation_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    reserve_record(path, size=16)
    record = {"outcome": "failed_to_start", "message": "m" * 100}
    write_record(path, record)
    assert json.loads(path.read_bytes()) == record


def filler(fill: Path, full: Path, release: Path) -> str:
    """A job's Python that fills the filesystem of `fill`, says so in `full` (elsewhere),
    then waits for `release` and exits 0."""
    return (
        "import os, time\n"
        f"fd = os.open({str(fill)!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "block = b'x' * 65536\n"
        "try:\n"
        "    while True: os.write(fd, block)\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    while True: os.write(fd, b'x')\n"
        "except OSError:\n"
        "    pass\n"
        f"open({str(full)!r}, 'w').close()\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n"
    )


def test_jobs_that_end_on_a_full_disk_keep_their_exit_codes_and_dependents(
    tmp_path: Path, small_fs: Path, daemon_factory: Any
) -> None:
    """With state_dir and log_dir on a filesystem a job has filled, every job that ends
    meanwhile is recorded with its own exit code, and its dependents run (once there is
    room for them)."""
    daemon = daemon_factory(
        simulate="8x24G",
        config={
            "database": f"sqlite:///{tmp_path / 'gpusched.db'}",
            "state_dir": str(small_fs / "state"),
            "log_dir": str(small_fs / "logs"),
        },
    ).start()
    go = tmp_path / "go"
    codes = [0, 5, 3, 0]
    jobs = [
        daemon.submit(
            "--mem", "1G", "--", sys.executable, "-c", job_until(go, tmp_path / f"m{i}", c)
        )
        for i, c in enumerate(codes)
    ]
    dependents = [
        daemon.submit("--mem", "1G", "--after", f"{j}:{'ok' if c == 0 else 'failed'}", "--", "true")
        for j, c in zip(jobs, codes, strict=True)
    ]
    for job in jobs:
        daemon.supervisor_pid(job)
    fill, full, release = small_fs / "logs" / "fill", tmp_path / "full", tmp_path / "release"
    filling = daemon.submit("--mem", "1G", "--", sys.executable, "-c", filler(fill, full, release))
    eventually(full.exists, 60, describe=lambda: daemon.show(filling))
    go.touch()
    for job, code in zip(jobs, codes, strict=True):
        ended = daemon.wait_state(job, {"done", "failed", "lost", "cancelled"}, timeout=60)
        assert (ended["state"], ended["exit_code"]) == (
            "done" if code == 0 else "failed",
            code,
        ), ended
    for dependent in dependents:  # none cancelled (it may have started in room freed since)
        assert daemon.show(dependent)["state"] != "cancelled"
    release.touch()
    assert daemon.wait_state(filling, {"done", "failed", "lost"}, timeout=60)["state"] == "done"
    with contextlib.suppress(FileNotFoundError):
        fill.unlink()
    for dependent in dependents:
        assert (
            daemon.wait_state(dependent, {"done", "failed", "cancelled", "lost"}, 60)["state"]
            == "done"
        ), daemon.show(dependent)


def on_small_fs(daemon_factory: Any, fs: Path) -> RunningDaemon:
    """A daemon whose database, state and logs are all on `fs` (the default layout)."""
    return daemon_factory(
        config={
            "database": f"sqlite:///{fs / 'state' / 'gpusched.db'}",
            "state_dir": str(fs / "state"),
            "log_dir": str(fs / "state" / "jobs"),
        }
    )


def refused_plainly(daemon: RunningDaemon) -> str:
    """A submit on the full disk: refused at once, in one line that says so."""
    started = time.monotonic()
    result = daemon.cli("submit", "--mem", "1G", "--", "true")
    took = time.monotonic() - started
    assert result.returncode != 0, result.stdout
    said = result.stderr.strip()
    assert "disk" in said and "full" in said, said
    assert "nothing was queued" in said, said
    assert "may have been" not in said, said
    assert len(said.splitlines()) == 1, said
    assert took < 5, (took, said)
    return said


def test_a_submit_on_a_full_disk_is_refused_plainly_and_accepted_once_there_is_room(
    small_fs: Path, daemon_factory: Any
) -> None:
    daemon = on_small_fs(daemon_factory, small_fs).start()
    first = daemon.submit("--mem", "1G", "--", "true")
    daemon.wait_state(first, {"done"})
    fill = fill_up(small_fs)
    # What the daemon kept for a full disk goes to recording: a pass notices the disk full.
    eventually(lambda: "full" in daemon.cli("submit", "--mem", "1G", "--", "true").stderr, 30)
    refused_plainly(daemon)
    assert [j["id"] for j in daemon.status("--all")["jobs"]] == [first]
    fill.unlink()
    job = eventually(lambda: daemon.cli("submit", "--mem", "1G", "--", "true").returncode == 0, 30)
    assert job
    assert "has room again" in daemon.stderr()


def test_the_daemon_starts_on_a_full_disk_records_ends_and_recovers(
    tmp_path: Path, small_fs: Path, daemon_factory: Any
) -> None:
    daemon = on_small_fs(daemon_factory, small_fs).start()
    go = tmp_path / "go"
    running = daemon.submit(
        "--mem", "1G", "--", sys.executable, "-c", job_until(go, tmp_path / "m", 4)
    )
    daemon.supervisor_pid(running)
    daemon.stop()
    fill = fill_up(small_fs)
    daemon.start()
    assert daemon.show(running)["state"] == "running"
    go.touch()
    ended = daemon.wait_state(running, {"done", "failed", "lost"}, timeout=30)
    assert (ended["state"], ended["exit_code"]) == ("failed", 4), ended
    refused_plainly(daemon)
    assert "Traceback" not in daemon.stderr()
    fill.unlink()
    eventually(lambda: daemon.cli("submit", "--mem", "1G", "--", "true").returncode == 0, 30)
