"""The stage itself: the daemon runs as root under the unit's limits and serves a local user."""

from __future__ import annotations

from collections.abc import Callable

import psutil

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user


def test_root_daemon_runs_under_the_units_limits_and_serves_a_user(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon()
    assert daemon.process is not None
    process = psutil.Process(daemon.process.pid)
    assert process.uids().effective == 0
    limits = daemon.limits  # type: ignore[attr-defined]
    soft, hard = process.rlimit(psutil.RLIMIT_NOFILE)
    # The daemon may raise its own soft limit, never lower it; the unit's figure applies
    # as far as this machine's hard limit allows.
    assert soft >= min(limits.nofile, hard)
    for cgroup in limits.cgroups:
        # In it, or in the leaf of its own it makes there (memory: docs/operations.md,
        # "Memory and cgroups"): under the limit either way.
        inside = [cgroup, cgroup / "daemon"]
        assert any(
            str(daemon.process.pid) in (c / "cgroup.procs").read_text().split()
            for c in inside
            if c.is_dir()
        )

    socket_path = daemon.socket_path
    job = as_user(mallory, lambda: Client(socket_path).submit(["id", "-u"], mem="1G").to_json())
    assert job["user"] == mallory.name
    done = daemon.wait_state(job["id"], {"done", "failed"})
    assert done["state"] == "done", done
    assert daemon.log(job["id"]).strip() == str(mallory.uid)
