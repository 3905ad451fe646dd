"""Issue 16, items 7 and 8: a job that forks continuously dies on cancel; a log is capped.

Mallory's job forks as fast as it can in three ways at once (a shell loop of background
sleeps, a process that forks and lets each parent exit so its pid keeps changing, and a
double-forked setsid daemon doing the same), all ignoring SIGTERM. Cancelled, it must be
recorded `cancelled` only when none of it runs, and the daemon must go on serving the
victim. Mallory's `yes` under a small `max_log_size` must leave a log within it, while
`logs -f` keeps following it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user

PYTHON = "/usr/bin/python3"  # the test's own interpreter is in /root, out of users' reach
# Each generation appends to ./beat (in mallory's home): if it grows, a hopper still runs.
HOPPER = """
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
beat = os.open("beat", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
while True:
    try:
        os.write(beat, b".")
        if os.fork() != 0:
            os._exit(0)
    except OSError:
        pass
"""
FORKER = (
    "trap '' TERM;"
    f" {PYTHON} -c '{HOPPER}' &"
    f" (setsid {PYTHON} -c '{HOPPER}' &);"
    " while :; do sleep 100 & sleep 0.005; done"
)
CAP = 1 << 20


def running_as(uid: int) -> list[int]:
    """Pids of `uid`'s processes that are not zombies."""
    found = []
    for process in psutil.process_iter(["uids", "status"]):
        info = process.info
        if info["uids"] and info["uids"].real == uid and info["status"] != "zombie":
            found.append(process.pid)
    return found


def beating(beat: Path) -> bool:
    """Whether a hopper still appends to `beat` (it does about every millisecond)."""
    before = beat.stat().st_size if beat.exists() else 0
    time.sleep(0.3)  # the window in which a live hopper would have written
    return (beat.stat().st_size if beat.exists() else 0) != before


def test_cancel_leaves_nothing_of_a_job_that_forks_continuously(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon(kill_grace="1s")
    sock = daemon.socket_path
    victims = as_user(victim, lambda: Client(sock).submit(["sleep", "60"], mem="1G").id)
    beat = Path(mallory.home) / "beat"
    job_id = as_user(mallory, lambda: Client(sock).submit(["sh", "-c", FORKER], mem="1G").id)
    daemon.wait_state(job_id, {"running"})
    eventually(
        lambda: beat.exists() and beat.stat().st_size > 200 and len(running_as(mallory.uid)) > 20
    )

    started = time.monotonic()
    as_user(mallory, lambda: Client(sock).cancel(job_id).id)
    job = daemon.wait_state(job_id, {"cancelled", "failed", "done", "lost"}, timeout=60)
    took = time.monotonic() - started
    assert job["state"] == "cancelled", job
    # Recorded only once the whole tree was gone: nothing of mallory's runs, then or later.
    assert running_as(mallory.uid) == []
    assert not beating(beat)
    assert took < 30, took  # kill_grace (1s) and the kill loop, not a hang

    # The daemon still schedules, and the victim's job was untouched.
    assert daemon.show(victims)["state"] == "running"
    quick = as_user(victim, lambda: Client(sock).submit(["echo", "still here"], mem="1G").id)
    assert daemon.wait_state(quick, {"done", "failed"})["state"] == "done"
    assert daemon.log(quick) == "still here\n"


def test_a_job_printing_as_fast_as_it_can_keeps_its_log_within_max_log_size(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon(max_log_size="1M")
    sock = daemon.socket_path
    victims = as_user(
        victim,
        lambda: Client(sock).submit(["sh", "-c", "echo start; sleep 2; echo end"], mem="1G").id,
    )
    job_id = as_user(mallory, lambda: Client(sock).submit(["yes", "spam"], mem="1G").id)
    daemon.wait_state(job_id, {"running"})
    log_path = Path(daemon.show(job_id)["log_path"])

    def follow() -> dict[str, Any]:
        """`logs -f` as mallory: it keeps getting output across cuts, never stuck."""
        client, offset, read, markers = Client(sock), 0, 0, 0
        deadline = time.monotonic() + 60
        while (read < 4 * CAP or not markers) and time.monotonic() < deadline:
            chunk = client.logs(job_id, offset)
            offset, read = chunk.offset, read + len(chunk.data)
            markers += chunk.data.count(b"bytes of output dropped")
            if not chunk.data:
                time.sleep(0.05)
        return {"read": read, "markers": markers}

    followed = as_user(mallory, follow)
    assert followed["read"] >= 4 * CAP and followed["markers"] >= 1, followed
    as_user(mallory, lambda: Client(sock).cancel(job_id).id)
    assert daemon.wait_state(job_id, {"cancelled"}, timeout=60)["state"] == "cancelled"
    # The documented bound: once the job has ended, its log is within max_log_size.
    assert log_path.stat().st_size <= CAP
    shown = as_user(mallory, lambda: _read_all(sock, job_id))
    assert shown["size"] <= CAP and shown["markers"] == 1, shown

    # The victim's job and the daemon were unaffected.
    assert daemon.wait_state(victims, {"done", "failed"})["state"] == "done"
    assert daemon.log(victims) == "start\nend\n"
    assert daemon.client().ping()["uid"] == 0


def _read_all(sock: Path, job_id: int) -> dict[str, int]:
    client, offset, data = Client(sock), 0, b""
    while (chunk := client.logs(job_id, offset)).data:
        data, offset = data + chunk.data, chunk.offset
    return {"size": len(data), "markers": data.count(b"bytes of output dropped")}
