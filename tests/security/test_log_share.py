"""Each user's share of `log_dir` (`retention.user_log_bytes`), beside each job's cap.

One user's sweep of big logs must not fill `log_dir` for everyone: once a user's logs
add up to more than their share, that user's oldest ended logs are removed first (and
`show` says why), then their running logs are cut as `max_log_size` cuts them; no other
user's log is touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.cli.show_view import show_lines, show_wire
from gpusched.client import Client
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user

KiB, MiB = 2**10, 2**20
SHARE_GONE = "its owner's log share was full"


def _submit(daemon: RunningDaemon, user: User, **args: Any) -> Any:
    sock = daemon.socket_path
    request = {"cwd": user.home, "umask": 0o022, "mem": 2**30, "env": {"PATH": "/usr/bin:/bin"}}
    return as_user(user, lambda: Client(sock, timeout_s=60).request("submit", **request, **args))


def _ended(daemon: RunningDaemon, ids: list[int]) -> bool:
    jobs = {j["id"]: j for j in daemon.status("--all")["jobs"]}
    return all(jobs[i]["state"] == "done" for i in ids)


def _show_text(daemon: RunningDaemon, job_id: int) -> str:
    return "\n".join(show_lines(daemon.client().request("show", **show_wire(job_id)), 100))


def _user_log_bytes(daemon: RunningDaemon, uid: int) -> int:
    logs = daemon.root / "logs"
    return sum(p.stat().st_size for p in logs.iterdir() if p.stat().st_uid == uid)


def test_a_sweep_past_its_share_loses_its_own_oldest_ended_logs_first(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    # The periodic pass is far off: the check at each job's end must keep the share.
    daemon = root_daemon(retention={"user_log_bytes": "2M"})
    kept = _submit(daemon, victim, command=["sh", "-c", "head -c 1500K /dev/zero; echo v"])
    eventually(lambda: _ended(daemon, [kept["id"]]), timeout=60)
    victim_log = Path(daemon.show(kept["id"])["log_path"])
    victim_size = victim_log.stat().st_size
    # Each log is 700K: two fit in the share of 2M, three do not.
    sweep = _submit(
        daemon,
        mallory,
        command=["sh", "-c", "head -c 700K /dev/zero; echo {i}"],
        sweep=[["i", [str(i) for i in range(6)]]],
        max_concurrent=1,
    )
    ids = [job["id"] for job in sweep]
    eventually(lambda: _ended(daemon, ids), timeout=120, interval=0.5)

    def within() -> bool:
        return _user_log_bytes(daemon, mallory.uid) <= 2 * MiB

    eventually(within, timeout=30, describe=lambda: _user_log_bytes(daemon, mallory.uid))
    shown = {i: daemon.show(i) for i in ids}
    by_end = sorted(ids, key=lambda i: (shown[i]["ended_at"], i))
    removed, left = by_end[:4], by_end[4:]
    for job_id in left:
        assert shown[job_id]["log_path"] and os.path.exists(shown[job_id]["log_path"])
    for job_id in removed:
        assert shown[job_id]["log_path"] is None
        assert shown[job_id]["log_removed"] == SHARE_GONE
        assert f"log removed: {SHARE_GONE}" in _show_text(daemon, job_id)
    assert victim_log.stat().st_size == victim_size
    assert daemon.show(kept["id"])["log_removed"] is None


def test_running_logs_past_the_share_are_cut_and_no_one_elses(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon(retention={"user_log_bytes": "2M", "every": "1s"})
    calm = _submit(daemon, victim, command=["sh", "-c", "head -c 1500K /dev/zero; sleep 60"])
    loud = _submit(
        daemon,
        mallory,
        command=["sh", "-c", "head -c 1500K /dev/zero; echo {i}; sleep 60"],
        sweep=[["i", ["1", "2", "3"]]],
    )
    logs = daemon.root / "logs"

    def written(job: dict[str, Any]) -> bool:
        """Its 1500K and its line are out: a log still being written may be small yet."""
        path = daemon.show(job["id"])["log_path"]
        return path is not None and Path(path).read_bytes().endswith(b"\n")

    eventually(
        lambda: (
            len([p for p in logs.iterdir() if p.stat().st_uid == mallory.uid]) == 3
            and all(written(job) for job in loud)
            and _user_log_bytes(daemon, mallory.uid) <= 2 * MiB
        ),
        timeout=60,
        describe=lambda: _user_log_bytes(daemon, mallory.uid),
    )
    # Which of them were cut depends on when each wrote (a check may find one log still
    # small): at least one was, and a log left whole is all its job wrote.
    marker = b"bytes of output dropped here (retention.user_log_bytes)"
    texts = [Path(daemon.show(job["id"])["log_path"]).read_bytes() for job in loud]
    assert any(marker in text for text in texts)
    for text in texts:
        assert marker in text or len(text) == 1500 * KiB + 2, len(text)
    calm_log = Path(daemon.show(calm["id"])["log_path"])
    assert calm_log.stat().st_size == 1500 * KiB
    for job_id in [calm["id"], *(job["id"] for job in loud)]:
        daemon.cli("cancel", str(job_id))
