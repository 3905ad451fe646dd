"""The requests of interactive jobs (`run`, `placement`, `run_ended`), through dispatch,
with no socket: the caller's pid is a real process, as SO_PEERCRED would give it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.errors import ConflictError, PermissionDenied, UsageError
from gpusched.core.models import JobState
from gpusched.daemon.identity import Caller
from tests.fakes import GiB
from tests.test_handlers import Daemon
from tests.world import make_world

ME = Caller(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), user="me", admin=False)
RUN = {"command": ["bash"], "cwd": "/", "mem": 4 * GiB}


def daemon_with(tmp_path: Path, **config: Any) -> Daemon:
    return Daemon(make_world(tmp_path, [24 * GiB], **config))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    made = daemon_with(tmp_path)
    yield made
    made.world.scheduler.store.close()


def test_run_queues_a_job_whose_process_is_the_caller(daemon: Daemon) -> None:
    job = daemon.ask(ME, "run", **RUN)
    assert (job["interactive"], job["pid"], job["uid"]) == (True, os.getpid(), os.getuid())
    assert daemon.world.scheduler.store.jobs.launch_info(job["id"]).env == {}  # nothing stored
    daemon.world.tick()
    placed = daemon.ask(ME, "placement", id=job["id"], timeout=0)
    assert placed["job"]["state"] == "running"
    assert placed["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert placed["env"]["GPUSCHED_JOB_ID"] == str(job["id"])
    assert placed["env_defaults"]["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    ended = daemon.ask(ME, "run_ended", id=job["id"], exit_code=0)
    assert (ended["state"], ended["reason"]) == ("done", "exit")
    with pytest.raises(ConflictError, match="was interactive"):
        daemon.ask(ME, "requeue", id=job["id"])  # its environment was never stored


def test_the_caller_must_be_a_live_process_of_its_own(daemon: Daemon) -> None:
    gone = Caller(pid=2**22 + 7, uid=ME.uid, gid=ME.gid, user="me", admin=False)
    with pytest.raises(ConflictError, match="is gone"):
        daemon.ask(gone, "run", **RUN)
    someone_else = Caller(pid=os.getpid(), uid=ME.uid + 4242, gid=0, user="x", admin=False)
    with pytest.raises(ConflictError, match="is gone"):  # our pid is not theirs
        daemon.ask(someone_else, "run", **RUN)
    assert daemon.world.scheduler.store.jobs.active() == []


def test_only_the_queuing_process_waits_for_it_or_ends_it(daemon: Daemon) -> None:
    job = daemon.ask(ME, "run", **RUN)["id"]
    other = subprocess.Popen(["sleep", "30"])
    try:
        sibling = Caller(pid=other.pid, uid=ME.uid, gid=ME.gid, user="me", admin=False)
        for op, args in (("placement", {"timeout": 0}), ("run_ended", {"exit_code": 0})):
            with pytest.raises(PermissionDenied, match="another process"):
                daemon.ask(sibling, op, id=job, **args)
    finally:
        other.kill()
        other.wait()
    with pytest.raises(ConflictError, match="has not started"):
        daemon.ask(ME, "run_ended", id=job, exit_code=0)
    batch = daemon.queue(ME)
    with pytest.raises(UsageError, match="not an interactive job"):
        daemon.ask(ME, "placement", id=batch, timeout=0)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"exit_code": 256}, "between 0 and 255"),
        ({"signal": 0}, "between 1 and 64"),
    ],
)
def test_run_ended_checks_what_it_is_told(
    daemon: Daemon, args: dict[str, Any], problem: str
) -> None:
    job = daemon.ask(ME, "run", **RUN)["id"]
    daemon.world.tick()
    with pytest.raises(UsageError, match=problem):
        daemon.ask(ME, "run_ended", id=job, **args)
    assert daemon.state(job) == JobState.RUNNING


def test_interactive_time_limits_from_the_config(tmp_path: Path) -> None:
    daemon = daemon_with(tmp_path, interactive={"default_time": "8h", "max_time": "1d"})
    assert daemon.ask(ME, "run", **RUN)["time_limit_s"] == 8 * 3600
    assert daemon.ask(ME, "run", **RUN, time=3600)["time_limit_s"] == 3600
    with pytest.raises(UsageError, match="at most 1d here"):
        daemon.ask(ME, "run", **RUN, time=2 * 86400)
    capped = daemon_with(tmp_path / "max", interactive={"max_time": "2h"})
    assert capped.ask(ME, "run", **RUN)["time_limit_s"] == 7200
    off = daemon_with(tmp_path / "off", interactive={"max_per_user": 0})
    with pytest.raises(UsageError, match=r"switched off here \(interactive.max_per_user 0\)"):
        off.ask(ME, "run", **RUN)
