"""The supervisor zygote (gpusched.processes.zygote) behind a real daemon.

Jobs start through it; a dead zygote costs nothing but speed (the job starts through a
fresh interpreter and the zygote comes back); it never outlives its daemon, while the
supervisors it forked do and are re-adopted with their real exit code.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import psutil

from gpusched.processes.zygote import IDENTITY_FILE, recorded_supervisor
from tests.daemon_harness import RunningDaemon, eventually, job_until


def _zygote(daemon: RunningDaemon, timeout_s: float = 10) -> psutil.Process:
    """The daemon's zygote: its child running `python -m gpusched.processes.zygote`."""
    assert daemon.process is not None
    parent = psutil.Process(daemon.process.pid)

    def zygote() -> psutil.Process | None:
        for child in parent.children():
            try:
                if "gpusched.processes.zygote" in child.cmdline() and child.status() != "zombie":
                    return child
            except psutil.Error:
                continue
        return None

    found = eventually(zygote, timeout_s)
    assert found is not None  # it is true
    return found


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _gone(pid: int, timeout_s: float = 10) -> bool:
    try:
        return eventually(lambda: _ended(pid), timeout_s)
    except AssertionError:
        return False


def _started_via(daemon: RunningDaemon, job_id: int) -> str:
    found = re.findall(rf"job {job_id} started on GPU \d+ \(pid \d+, via (\w+)\)", daemon.stderr())
    assert len(found) == 1, daemon.stderr()[-3000:]
    return str(found[0])


def test_jobs_start_through_the_zygote_as_if_started_fresh(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    go = tmp_path / "go"  # the job runs until the test has looked at its supervisor
    script = f"while [ ! -e {go} ]; do sleep 0.05; done; exit 7"
    job_id = daemon.submit("--mem", "1G", "--", "sh", "-c", script)
    supervisor = psutil.Process(daemon.supervisor_pid(job_id))
    zygote = _zygote(daemon)
    assert supervisor.ppid() == zygote.pid
    assert _started_via(daemon, job_id) == "zygote"
    # Its own session, like a supervisor started with start_new_session, and none of the
    # zygote's descriptors: no socket (the control channel) in the supervisor.
    assert os.getsid(supervisor.pid) == supervisor.pid
    fds = [
        os.readlink(f"/proc/{supervisor.pid}/fd/{fd}")
        for fd in os.listdir(f"/proc/{supervisor.pid}/fd")
    ]
    assert not [fd for fd in fds if fd.startswith("socket:")], fds
    assert os.readlink(f"/proc/{supervisor.pid}/fd/2").endswith(f"/{job_id}/supervisor.err")
    # Its identity is on record next to its spec, for a daemon that restarts.
    job_dir = daemon.root / "state" / "jobs" / str(job_id)
    assert (job_dir / IDENTITY_FILE).exists()
    assert recorded_supervisor(job_dir) == supervisor.pid
    # `ps` names its job, not the zygote's command line.
    title = " ".join(supervisor.cmdline()).strip()
    assert title.startswith(f"gpusched supervisor: job {job_id} "), title
    assert title.endswith(str(job_dir / "spec.json")), title
    go.touch()
    assert daemon.cli("wait", str(job_id), timeout=30).returncode == 7
    # The zygote reaps the supervisors it forked: no zombie is left under it.
    assert _gone(supervisor.pid)
    eventually(lambda: not any(c.status() == "zombie" for c in zygote.children()), 5)


def test_a_dead_zygote_costs_one_slow_start_and_comes_back(daemon: RunningDaemon) -> None:
    first = _zygote(daemon)
    first.kill()
    assert _gone(first.pid)
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", "print('fallback')")
    job = daemon.wait_state(job_id, {"done", "failed", "lost"})
    assert (job["state"], job["exit_code"]) == ("done", 0), job
    assert daemon.log(job_id) == "fallback\n"
    assert _started_via(daemon, job_id) == "popen"
    assert "supervisor zygote exited: starting a job's supervisor directly" in daemon.stderr()
    # A new zygote forks the next job.
    second = _zygote(daemon)
    assert second.pid != first.pid
    job_id = daemon.submit("--mem", "1G", "--", "true")
    job = daemon.wait_state(job_id, {"done", "failed", "lost"})
    assert (job["state"], job["exit_code"]) == ("done", 0), job
    assert _started_via(daemon, job_id) == "zygote"
    assert "Traceback" not in daemon.stderr()


def test_a_zygote_that_stops_answering_is_replaced_and_the_job_runs_once(
    daemon_factory: object, tmp_path: Path
) -> None:
    daemon = daemon_factory().start()  # type: ignore[operator]
    zygote = _zygote(daemon)
    zygote.suspend()  # alive, but it will never answer
    ran = tmp_path / "ran"
    try:
        job_id = daemon.submit("--mem", "1G", "--", "sh", "-c", f"echo x >> {ran}")
        job = daemon.wait_state(job_id, {"done", "failed", "lost"}, timeout=40)
    finally:
        if zygote.is_running():
            zygote.resume()
    assert (job["state"], job["exit_code"]) == ("done", 0), job
    assert ran.read_text() == "x\n"
    assert _started_via(daemon, job_id) == "popen"
    assert _gone(zygote.pid)  # killed, and reaped by the daemon
    assert _zygote(daemon).pid != zygote.pid


def test_the_zygote_dies_with_its_daemon_and_its_jobs_are_readopted(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    marker = tmp_path / "finished"
    go = tmp_path / "go"  # it runs until the restarted daemon has re-adopted it
    script = job_until(go, marker, 4)
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", script)
    supervisor = daemon.supervisor_pid(job_id)
    zygote = _zygote(daemon)
    assert psutil.Process(supervisor).ppid() == zygote.pid
    daemon.stop(signal.SIGKILL)
    assert _gone(zygote.pid, timeout_s=5), "the zygote outlived its daemon"
    assert not _gone(supervisor, timeout_s=0.2), "the job must outlive the daemon and zygote"
    daemon.start()
    assert f"job {job_id} still running (pid {supervisor}): re-adopted" in daemon.stderr()
    go.touch()
    assert daemon.cli("wait", str(job_id), timeout=30).returncode == 4
    job = daemon.show(job_id)
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit", 4)
    assert marker.exists()


def test_the_control_channel_is_not_in_the_filesystem(daemon: RunningDaemon) -> None:
    zygote = _zygote(daemon)
    sockets = list(zygote.net_connections(kind="unix"))
    assert sockets, "the zygote has no control channel"
    assert all(not c.laddr and not c.raddr for c in sockets), sockets
    assert all(c.type == socket.SOCK_SEQPACKET for c in sockets), sockets
