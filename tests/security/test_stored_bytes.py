"""What a user's submits make the daemon store and answer stays within budgets.

Before: the per-user byte budget (retention.user_bytes_per_minute) counted a submit's
environment and commands but not `--notify` (up to 16 KiB a job), `--cwd` or `--output`
(up to 4 KiB each), so held sweeps carrying a 16 KiB `--notify`, submitted and
cancelled, grew the database without a refusal; and each bulk submit or cancel answered
with every job's full JSON (32 MiB for a large sweep, the daemon building all of it),
or, for a cancel whose listing was too long, with an error although the jobs were
cancelled.

Now every text a job's row keeps is counted, per job, and a bulk reply longer than
gpusched.daemon.bulk.BULK_REPLY_BYTES is an object with the count and the ids as ranges.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import ConflictError
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user

KiB, MiB = 2**10, 2**20
NOTIFY = ["true", "n" * (16 * KiB - 8)]  # the largest `--notify` a request carries


def _request(daemon: RunningDaemon, user: User, op: str, **args: Any) -> Any:
    sock = daemon.socket_path
    return as_user(user, lambda: Client(sock, timeout_s=120).request(op, **args))


def _sweep(daemon: RunningDaemon, user: User, jobs: int, **args: Any) -> Any:
    request = {
        "cwd": user.home,
        "umask": 0o022,
        "mem": 2**30,
        "env": {"PATH": "/usr/bin:/bin"},
        "command": ["true", "{i}"],
        "sweep": [["i", [str(i) for i in range(jobs)]]],
        "hold": True,
        **args,
    }
    return _request(daemon, user, "submit", **request)


def _deep_dir(user: User) -> str:
    """A directory of the user's own whose path is about 3.5 KiB long."""

    def make() -> str:
        path = user.home
        for n in range(14):
            path = os.path.join(path, f"{n:02d}" + "d" * 240)
        os.makedirs(path, exist_ok=True)
        return path

    return str(as_user(user, make))


def _ids(reply: Any) -> list[int]:
    """Every id a bulk reply names: the list's jobs, or the summary's ranges."""
    if isinstance(reply, list):
        return [int(job["id"]) for job in reply]
    return [n for first, last in reply["ids"] for n in range(first, last + 1)]


@pytest.mark.parametrize("texts", ["notify", "cwd_and_output"])
def test_notify_cwd_and_output_count_against_the_byte_budget(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], texts: str
) -> None:
    mallory, victim = people
    daemon = root_daemon(retention={"user_bytes_per_minute": "1M"})
    if texts == "notify":
        extra: dict[str, Any] = {"notify": NOTIFY}
    else:
        deep = _deep_dir(mallory)
        extra = {"cwd": deep, "output": os.path.join(deep, "o{index}")}
    # 40 jobs: well under a MiB of commands, but 40 x 7-16 KiB of the other texts.
    first = _sweep(daemon, mallory, 40, **extra)
    assert len(_ids(first)) == 40
    with pytest.raises(ConflictError) as refused:  # 160 jobs x 7 KiB or more: past 1 MiB
        _sweep(daemon, mallory, 160, **extra)
    message = str(refused.value)
    assert "\n" not in message and "retention.user_bytes_per_minute" in message
    # Nothing queued is lost, and the other user's budget is their own.
    assert len(_ids(_sweep(daemon, victim, 40))) == 40
    held = [j for j in daemon.status()["jobs"] if j["user"] == mallory.name]
    assert len(held) >= 40
