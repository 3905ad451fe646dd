"""`gpusched doctor` run by an ordinary user of a root daemon: it checks what that user
can act on, from the daemon's side (the cards the daemon schedules), and never tells
them to `sudo`: the daemon's files, cards and service are its administrator's."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user


def test_a_user_of_a_root_daemon_is_told_what_is_theirs(
    root_daemon: Callable[..., RunningDaemon], people: tuple[User, User]
) -> None:
    daemon = root_daemon(simulate="3x24G")
    student, _ = people
    socket_path = str(daemon.socket_path)

    def doctor() -> list[dict[str, Any]]:
        from gpusched.cli.doctor import run_checks

        os.environ.pop("GPUSCHED_CONFIG", None)  # a student has no config of their own
        os.environ["GPUSCHED_SOCKET"] = socket_path
        return [c.to_json() for c in run_checks(system_config=daemon.root / "no-such.yaml")]

    checks = {c["name"]: c for c in as_user(student, doctor)}
    assert checks["daemon"]["status"] == "ok", checks["daemon"]
    assert checks["gpus"]["status"] == "ok", checks["gpus"]
    assert checks["gpus"]["message"].startswith("the daemon reads 3 GPU(s)"), checks["gpus"]
    for name in ("devices", "state_dir", "log_dir", "database"):
        assert checks[name]["status"] == "skip", checks[name]
    told = [c["fix"] for c in checks.values() if c["fix"]]
    assert not [fix for fix in told if "sudo" in fix], told
