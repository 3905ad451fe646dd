"""A second daemon started by mistake on a live one's config touches nothing of it.

Before: it started its supervisor zygote and re-adopted the first daemon's running jobs
(as if they were its own, after a restart), and only then found the socket answered
and exited. Now it asks the socket first: another daemon answering there ends the start
with one line, before any zygote, adoption or hook runs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.daemon_harness import RunningDaemon
from tests.users import User


def test_a_second_daemon_refuses_before_it_adopts_or_starts_a_zygote(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon()
    job = daemon.submit("--", "sleep", "60", cwd=mallory.home)
    daemon.wait_state(job, {"running"})
    second = subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert second.returncode != 0
    assert "already listening" in second.stderr, second.stderr
    assert "re-adopted" not in second.stderr, second.stderr
    assert "zygote started" not in second.stderr, second.stderr
    # The first daemon still has its job, running, and answers.
    assert daemon.show(job)["state"] == "running"
    daemon.cli("cancel", str(job))
