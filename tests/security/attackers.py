"""Attacker processes for the security suite: a user's child that opens (and holds) what
a test tells it to, and what a test does to a root daemon from outside (its file limit).

`attacking(user, attack)` forks, becomes the user, runs attack() and keeps whatever it
opened until the test's block ends; the test reads the attack's report meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user

Attack = Callable[[], dict[str, Any]]
# gpusched.processes.fdbudget.FD_RESERVE, spelt out so that this module also runs against the code
# before it (each test here fails there).
FD_RESERVE = 64
_kept: list[socket.socket] = []  # in an attacker: what it holds until the test lets go


@contextlib.contextmanager
def attacking(user: User, attack: Attack) -> Iterator[Callable[[], dict[str, Any]]]:
    """Run attack() as `user` in a child that keeps what it opened until the block ends.

    Yields a function that waits for the attack's report (what it opened, what it saw).
    """
    report_r, report_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker: never returns
        try:
            os.close(report_r)
            os.close(release_w)
            os.setgroups(user.groups())
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.chdir(user.home)
            try:
                report = attack()
            except BaseException:  # the test says what went wrong
                report = {"crash": traceback.format_exc()}
            os.write(report_w, json.dumps(report).encode() + b"\n")
            os.read(release_r, 1)  # hold everything until the test lets go
        finally:
            os._exit(0)
    os.close(report_w)
    os.close(release_r)

    def wait_report(timeout: float = 60) -> dict[str, Any]:
        ready, _, _ = select.select([report_r], [], [], timeout)
        assert ready, f"the attack did not report within {timeout}s"
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(report_r, 65536)
            assert chunk, "the attacker died without a report"
            line += chunk
        report = dict(json.loads(line))
        assert "crash" not in report, report["crash"]
        return report

    try:
        yield wait_report
    finally:
        os.close(release_w)
        os.close(report_r)
        os.waitpid(pid, 0)


def _still_open(conns: list[socket.socket]) -> int:
    """How many of these connections the server keeps open (neither closed nor refused)."""
    held = 0
    for conn in conns:
        conn.setblocking(False)
        try:
            conn.recv(1, socket.MSG_PEEK)  # a refusal, or the end: not held
        except BlockingIOError:
            held += 1  # nothing to read and not closed: the server holds it
        except OSError:
            pass
    return held


def _settled_count(conns: list[socket.socket]) -> int:
    """_still_open once it stops changing (the server refuses a backlog in a moment)."""
    last, same = -1, 0
    while same < 3:
        now = _still_open(conns)
        same = same + 1 if now == last else 0
        last = now
        time.sleep(0.2)
    return last


def open_many(connect: Callable[[], socket.socket], count: int) -> Attack:
    def attack() -> dict[str, Any]:
        conns, failed = [], 0
        for _ in range(count):
            try:
                conns.append(connect())
            except OSError:
                failed += 1
        held = _settled_count(conns)
        refusals = []
        for conn in conns:
            with contextlib.suppress(OSError):
                data = conn.recv(4096, socket.MSG_PEEK)
                if data:
                    refusals.append(data.decode(errors="replace"))
                    break
        _kept.extend(conns)
        return {"opened": len(conns), "failed": failed, "held": held, "refusal": refusals[:1]}

    return attack


def unix_connect(path: Path) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(2)  # a full backlog makes a Unix connect wait
        conn.connect(str(path))
        return conn

    return connect


def tcp_connect(port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        # Not create_connection: its name lookup needs the idna codec, which a user cannot
        # import from root's Python installation.
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.settimeout(2)
        conn.connect(("127.0.0.1", port))
        return conn

    return connect


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def victim_is_served(daemon: RunningDaemon, victim: User) -> float:
    """The victim's status, submit and a job that runs to the end; seconds it all took."""
    path = daemon.socket_path
    began = time.monotonic()

    def act() -> dict[str, Any]:
        client = Client(path, timeout_s=10)
        client.status()
        return client.submit(["true"], mem="1G").to_json()

    job = as_user(victim, act)
    done = daemon.wait_state(job["id"], {"done", "failed"}, timeout=30)
    assert done["state"] == "done", done
    return time.monotonic() - began


def set_daemon_open_files(daemon: RunningDaemon, headroom: int) -> int:
    """Lower the running daemon's soft open-file limit to what it uses plus `headroom`."""
    assert daemon.process is not None
    process = psutil.Process(daemon.process.pid)
    _soft, hard = process.rlimit(psutil.RLIMIT_NOFILE)
    limit = process.num_fds() + headroom
    process.rlimit(psutil.RLIMIT_NOFILE, (limit, hard))
    return limit


def restore_daemon_open_files(daemon: RunningDaemon) -> None:
    assert daemon.process is not None
    process = psutil.Process(daemon.process.pid)
    _soft, hard = process.rlimit(psutil.RLIMIT_NOFILE)
    process.rlimit(psutil.RLIMIT_NOFILE, (hard, hard))
