"""Item 9 of issue 27: a hook's child that leaves its session (setsid) is killed at the
hook's timeout with the rest: each hook runs in a cgroup of its own beside the daemon's
(gpusched.processes.cgroups), and everything left in it is killed. Before, only the
hook's process group was, and `setsid sleep 333` lived on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_hooks_setsid_child_is_killed_at_the_hook_timeout(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon(hook_timeout="2s")
    marks = Path(mallory.home)
    pid_file = marks / "escaped.pid"
    hook = f"sh -c 'setsid sh -c \"echo \\$\\$ > {pid_file}; exec sleep 333\" & sleep 100'"
    sock = daemon.socket_path
    as_user(
        mallory,
        lambda: Client(sock).submit(["true"], mem="1G", cwd=mallory.home, notify=hook).to_json(),
    )
    escaped = int(
        eventually(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            20,
            describe=daemon.stderr,
        )
    )
    assert psutil.Process(escaped).uids().real == mallory.uid
    eventually(lambda: "still running after 2s: killed" in daemon.stderr(), timeout=20)
    eventually(lambda: not _alive(escaped), timeout=10)
