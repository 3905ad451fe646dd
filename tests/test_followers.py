"""The commands that follow a job until it ends, `wait` and `logs -f`: they ride out a
daemon restart (however the socket was chosen), give up only after FOLLOW_WAIT_S with
advice that fits how the socket was chosen, and end quietly with 130 on Ctrl-C. Real
daemons on simulated GPUs, the real command line in its own process, real signals."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpusched.connection import FOLLOW_WAIT_S, DaemonConnection
from gpusched.core.errors import DaemonUnreachable
from tests.daemon_harness import RunningDaemon, eventually, job_until, run_cli


def _follower(daemon: RunningDaemon, *args: str, by_env: bool = False) -> subprocess.Popen[str]:
    """`gpusched ARGS` in its own process; `by_env`: the socket named by $GPUSCHED_SOCKET
    rather than by the daemon's config file."""
    env = dict(daemon.env)
    if by_env:
        env.pop("GPUSCHED_CONFIG", None)
        env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
    return subprocess.Popen(
        [sys.executable, "-m", "gpusched", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _connected(process: subprocess.Popen[str]) -> bool:
    """Whether the command holds a connection to a daemon (its wait request is in)."""
    with contextlib.suppress(psutil.Error):
        return bool(psutil.Process(process.pid).net_connections(kind="unix"))
    return False


def _a_job_until_go(daemon: RunningDaemon, tmp_path: Path, code: int) -> tuple[int, Path]:
    go = tmp_path / "go"
    script = tmp_path / "job.py"
    script.write_text("print('started', flush=True)\n" + job_until(go, tmp_path / "done", code))
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, str(script))
    daemon.wait_state(job_id, {"running"})
    return job_id, go


@pytest.mark.parametrize("by_env", [False, True], ids=["config", "GPUSCHED_SOCKET"])
def test_wait_and_logs_follow_survive_a_back_to_back_restart(
    daemon_factory: object, tmp_path: Path, by_env: bool
) -> None:
    daemon = daemon_factory().start()  # type: ignore[operator]
    job_id, go = _a_job_until_go(daemon, tmp_path, code=7)
    waiting = _follower(daemon, "wait", str(job_id), by_env=by_env)
    following = _follower(daemon, "logs", "-f", str(job_id), by_env=by_env)
    assert following.stdout is not None
    assert following.stdout.readline() == "started\n"
    eventually(lambda: _connected(waiting), 30)
    daemon.stop()
    daemon.start()
    go.touch()
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (7, f"job {job_id}: failed exit 7\n"), err
    _, err = following.communicate(timeout=60)
    assert following.returncode == 7, err
    assert "closed the connection" not in err and "cannot reach" not in err


def test_a_follower_gives_up_after_its_bound_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "gone.sock"
    connection = DaemonConnection(missing)
    connection.follow_s = 0.6
    said = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(said), pytest.raises(DaemonUnreachable) as raised:
        connection.request("ping")
    assert time.monotonic() - started >= 0.6
    assert "not even after 0.6s" in raised.value.message
    assert said.getvalue().count("retrying") == 1, said.getvalue()
    assert FOLLOW_WAIT_S >= 30


def test_the_advice_fits_gpusched_socket(tmp_path: Path) -> None:
    env = {**os.environ, "GPUSCHED_SOCKET": str(tmp_path / "gone.sock")}
    env.pop("GPUSCHED_CONFIG", None)
    for args in (["status"], ["history"]):
        done = run_cli(*args, env=env)
        assert done.returncode == 3, done
        assert "$GPUSCHED_SOCKET names it" in done.stderr, done.stderr
        assert "unset GPUSCHED_SOCKET" in done.stderr
        assert "Start it with `gpusched daemon`" not in done.stderr


@pytest.mark.parametrize("command", ["wait", "logs"])
def test_ctrl_c_ends_a_follower_quietly_with_130(
    daemon_factory: object, tmp_path: Path, command: str
) -> None:
    daemon = daemon_factory().start()  # type: ignore[operator]
    job_id, go = _a_job_until_go(daemon, tmp_path, code=0)
    if command == "wait":
        process = _follower(daemon, "wait", str(job_id))
        eventually(lambda: _connected(process), 30)
    else:
        process = _follower(daemon, "logs", "-f", str(job_id))
        assert process.stdout is not None
        assert process.stdout.readline() == "started\n"  # it follows now
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130, (out, err)
    assert err == "", err
    assert daemon.show(job_id)["state"] == "running"  # the job goes on
    go.touch()
