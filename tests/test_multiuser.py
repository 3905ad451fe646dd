"""A shared server: the daemon runs as root, jobs run as their owners, identity from the kernel.

These tests create throw-away Unix users (they need root, as CI has) and talk to the
daemon from processes running as those users, so the daemon sees them through SO_PEERCRED.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import ConflictError, PermissionDenied, UsageError
from gpusched.daemon.server import Server
from gpusched.daemon.services import Services
from tests.daemon_harness import RunningDaemon, in_process_scheduler
from tests.users import User, as_user, throwaway_users

REPORT = "id -u; id -g; id -G; echo $HOME $USER $LOGNAME $SHELL; umask; pwd"


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[list[User], str | None]]:
    with throwaway_users(2) as made:
        yield made


@pytest.fixture
def shared_daemon() -> Iterator[Any]:
    """Daemons in a directory every user can traverse (pytest's tmp dirs are root-only)."""
    made: list[RunningDaemon] = []

    def make(**config: Any) -> RunningDaemon:
        root = Path(tempfile.mkdtemp(prefix="gpusched-test-", dir="/tmp"))
        root.chmod(0o755)
        daemon = RunningDaemon(root, config=config)
        made.append(daemon)
        return daemon.start()

    yield make
    for daemon in made:
        daemon.stop()
        daemon.kill_jobs()
        shutil.rmtree(daemon.root, ignore_errors=True)


def submit_as(
    user: User, daemon: RunningDaemon, command: list[str], umask: int = 0o022, **kwargs: Any
) -> dict[str, Any]:
    socket_path = daemon.socket_path
    return dict(
        as_user(user, lambda: Client(socket_path).submit(command, **kwargs).to_json(), umask=umask)
    )


def request_as(who: User, daemon: RunningDaemon | _at, op: str, **args: Any) -> Any:
    socket_path = daemon.socket_path
    return as_user(who, lambda: Client(socket_path).request(op, **args))


def test_job_runs_as_its_owner_with_their_groups_home_and_umask(
    people: Any, shared_daemon: Any
) -> None:
    (alice, _bob), group = people
    daemon = shared_daemon()
    job = submit_as(alice, daemon, ["sh", "-c", REPORT], umask=0o027, mem="1G")
    assert (job["user"], job["uid"]) == (alice.name, alice.uid)
    done = daemon.wait_state(job["id"], {"done", "failed"})
    assert done["state"] == "done", done
    lines = daemon.log(job["id"]).splitlines()
    assert lines[0] == str(alice.uid)
    assert lines[1] == str(alice.gid)
    groups = {int(g) for g in lines[2].split()}
    assert groups == set(alice.groups())
    assert 0 not in groups
    assert lines[3] == f"{alice.home} {alice.name} {alice.name} /bin/sh"
    assert lines[4] == "0027"
    assert lines[5] == alice.home
    # The supervisor was forked by the zygote (the path every job takes while it lives).
    started = rf"job {job['id']} started on GPU \d+ \(pid {done['pid']}, via zygote\)"
    assert re.search(started, daemon.stderr()), daemon.stderr()
    log = Path(done["log_path"])
    info = log.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (alice.uid, 0o600)
    assert group is not None


def test_identity_comes_from_the_kernel_not_from_the_request(
    people: Any, shared_daemon: Any
) -> None:
    (alice, _bob), _ = people
    daemon = shared_daemon()
    forged = request_as(
        alice,
        daemon,
        "submit",
        command=["id", "-u"],
        cwd=alice.home,
        env={"PATH": "/usr/bin:/bin"},
        mem=2**30,
        user="root",
        uid=0,
        gid=0,
    )
    assert (forged["user"], forged["uid"]) == (alice.name, alice.uid)
    daemon.wait_state(forged["id"], {"done"})
    assert daemon.log(forged["id"]).strip() == str(alice.uid)


def test_users_act_only_on_their_own_jobs(people: Any, shared_daemon: Any) -> None:
    (alice, bob), _ = people
    daemon = shared_daemon()
    job = submit_as(alice, daemon, ["sleep", "60"], mem="1G", notify="mail alice@lab.org")
    daemon.wait_state(job["id"], {"running"})
    for op in ("cancel", "hold", "release", "logs"):
        with pytest.raises(PermissionDenied, match=f"belongs to {alice.name}"):
            request_as(bob, daemon, op, id=job["id"])
    seen_by_bob = request_as(bob, daemon, "show", id=job["id"])
    assert seen_by_bob["user"] == alice.name
    assert seen_by_bob["command"] == ["(hidden)"]
    assert seen_by_bob["notify"] == ["(hidden)"]  # an address is as private as a command
    status = request_as(bob, daemon, "status")
    mine = next(j for j in status["jobs"] if j["id"] == job["id"])
    assert (mine["state"], mine["mem"], mine["command"]) == ("running", 2**30, ["(hidden)"])
    seen_by_alice = request_as(alice, daemon, "show", id=job["id"])
    assert (seen_by_alice["command"], seen_by_alice["notify"]) == (
        ["sleep", "60"],
        ["mail", "alice@lab.org"],
    )
    # Root may act on everyone's jobs.
    assert daemon.cli("cancel", str(job["id"])).returncode == 0
    assert daemon.wait_state(job["id"], {"cancelled"})["reason_detail"] == "cancelled by root"


def test_cancel_all_takes_only_the_callers_own_jobs(people: Any, shared_daemon: Any) -> None:
    (alice, bob), _ = people
    daemon = shared_daemon()
    socket_path = daemon.socket_path

    def cancel_mine(who: Any, waiting_only: bool) -> list[tuple[int, str]]:
        found = as_user(
            who,
            lambda: [j.to_json() for j in Client(socket_path).cancel_mine(waiting_only)],
        )
        return [(job["id"], job["state"]) for job in found]

    running = submit_as(alice, daemon, ["sleep", "60"], mem="1G")["id"]
    daemon.wait_state(running, {"running"})
    held = submit_as(alice, daemon, ["true"], mem="1G", hold=True)["id"]
    queued = submit_as(alice, daemon, ["true"], mem="1G", after=[running])["id"]
    bobs = submit_as(bob, daemon, ["true"], mem="1G", hold=True)["id"]
    # --waiting: the jobs that have not started; the running one keeps running.
    assert sorted(cancel_mine(alice, True)) == [(held, "cancelled"), (queued, "cancelled")]
    assert daemon.show(running)["state"] == "running"
    # Root's --all is root's own jobs (none here), never everyone's.
    result = daemon.cli("cancel", "--all")
    assert (result.returncode, result.stdout) == (0, "no active jobs of yours\n")
    assert daemon.show(bobs)["state"] == "held"
    assert cancel_mine(bob, False) == [(bobs, "cancelled")]
    # Without --waiting, the running job too (it stops after the grace period).
    assert [job_id for job_id, _ in cancel_mine(alice, False)] == [running]
    assert (
        daemon.wait_state(running, {"cancelled"})["reason_detail"] == f"cancelled by {alice.name}"
    )
    assert cancel_mine(alice, False) == []


def test_only_administrators_drain_and_everyone_sees_it(people: Any, shared_daemon: Any) -> None:
    (alice, bob), _ = people
    daemon = shared_daemon(admins=[bob.name])
    with pytest.raises(PermissionDenied, match="only an administrator"):
        request_as(alice, daemon, "drain", on=True)
    drain = request_as(bob, daemon, "drain", on=True, reason="new GPU on Friday")
    assert (drain["by"], drain["reason"]) == (bob.name, "new GPU on Friday")
    assert request_as(alice, daemon, "status")["drain"] == drain
    with pytest.raises(PermissionDenied, match="only an administrator"):
        request_as(alice, daemon, "drain", on=False)
    assert request_as(bob, daemon, "drain", on=False) is None
    assert request_as(alice, daemon, "status")["drain"] is None


def test_admins_and_show_commands_from_the_config(people: Any, shared_daemon: Any) -> None:
    (alice, bob), _ = people
    daemon = shared_daemon(admins=[bob.name], show_commands=True)
    job = submit_as(alice, daemon, ["sleep", "60"], mem="1G")
    assert request_as(bob, daemon, "show", id=job["id"])["command"] == ["sleep", "60"]
    cancelled = request_as(bob, daemon, "cancel", id=job["id"])
    assert cancelled["id"] == job["id"]
    assert (
        daemon.wait_state(job["id"], {"cancelled"})["reason_detail"] == f"cancelled by {bob.name}"
    )


def test_a_working_directory_the_owner_cannot_enter_is_refused(
    people: Any, shared_daemon: Any
) -> None:
    (alice, _bob), _ = people
    daemon = shared_daemon()
    private = Path(tempfile.mkdtemp(prefix="gpusched-private-", dir="/tmp"))
    try:
        private.chmod(0o700)
        with pytest.raises(UsageError, match="cannot enter"):
            submit_as(alice, daemon, ["true"], mem="1G", cwd=str(private))
        with pytest.raises(UsageError, match="does not exist"):
            submit_as(alice, daemon, ["true"], mem="1G", cwd=str(daemon.root / "gone"))
        # Inside a directory she cannot enter, she is not even told whether it exists.
        with pytest.raises(UsageError, match="cannot enter"):
            submit_as(alice, daemon, ["true"], mem="1G", cwd=str(private / "gone"))
    finally:
        private.rmdir()


def test_a_planted_symlink_never_redirects_a_log(people: Any, shared_daemon: Any) -> None:
    (alice, _bob), _ = people
    daemon = shared_daemon()
    target = daemon.root / "precious"
    target.write_text("do not touch\n")
    logs = daemon.root / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "1.log").symlink_to(target)
    job = submit_as(alice, daemon, ["echo", "written by the job"], mem="1G")
    assert job["id"] == 1
    done = daemon.wait_state(1, {"done"})
    assert target.read_text() == "do not touch\n"
    log = Path(done["log_path"])
    assert not log.is_symlink()
    assert log.read_text() == "written by the job\n"
    assert log.stat().st_uid == alice.uid


def test_per_user_limits_wait_or_refuse_and_say_which(people: Any, shared_daemon: Any) -> None:
    (alice, bob), _ = people
    daemon = shared_daemon(
        limits={
            "default": {"max_running": 1, "max_queued": 2},
            "users": {bob.name: {"max_mem": "3G", "max_running": 5}},
        }
    )
    first = submit_as(alice, daemon, ["sleep", "60"], mem="1G")
    second = submit_as(alice, daemon, ["sleep", "60"], mem="1G")
    daemon.wait_state(first["id"], {"running"})
    waiting = daemon.wait_reason(second["id"], "user limit")
    assert waiting["waiting_reason"] == f"user limit: {alice.name} has 1 running (max_running 1)"
    submit_as(alice, daemon, ["true"], mem="1G")
    with pytest.raises(ConflictError, match="max_queued 2"):
        submit_as(alice, daemon, ["true"], mem="1G")
    # Bob is not held back by Alice's limits, only by his own memory cap.
    small = submit_as(bob, daemon, ["sleep", "60"], mem="2G")
    daemon.wait_state(small["id"], {"running"})
    big = submit_as(bob, daemon, ["true"], mem="2G")
    daemon.wait_reason(big["id"], "max_mem 3.0G")


def test_a_daemon_run_by_a_user_serves_only_that_user(people: Any) -> None:
    (alice, bob), _ = people
    root = Path(tempfile.mkdtemp(prefix="gpusched-single-", dir="/tmp"))
    root.chmod(0o755)
    scheduler = in_process_scheduler(root, "1x24G", kill_grace="1s")
    config, store = scheduler.context.config, scheduler.store
    services = Services(scheduler, store, scheduler.context.settings, owner_uid=alice.uid)
    server = Server(services, config.socket_path)
    server.bind()
    # A single-user socket is 0600; open it up so that the peer-credential check behind
    # the file mode is what is tested.
    config.socket_path.chmod(0o666)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert request_as(alice, _at(config.socket_path), "ping")["user"] == alice.name
        with pytest.raises(PermissionDenied, match=f"runs as {alice.name}"):
            request_as(bob, _at(config.socket_path), "ping")
    finally:
        server.close()
        scheduler.context.launcher.close()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


class _at:  # a stand-in with the one attribute request_as reads
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path


def test_root_mode_socket_is_open_and_state_is_private(shared_daemon: Any) -> None:
    daemon = shared_daemon()
    assert stat.S_IMODE(daemon.socket_path.stat().st_mode) == 0o666
    assert stat.S_IMODE((daemon.root / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE((daemon.root / "gpusched.db").stat().st_mode) == 0o600
    assert os.geteuid() == 0
