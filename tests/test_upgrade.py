"""An upgrade in place: a job started by the previous version runs on across it.

Before the layer packages, a daemon started a job's supervisor as
`python -m gpusched.supervisor SPEC` (or `python -m gpusched.zygote` forked it). After the
package is upgraded under running jobs, those supervisors go on running the old code,
and the new daemon must find them: by the pid it recorded or, when the old daemon died
before recording it, by that command line. Both old module paths stay runnable (a
daemon of the previous version that is still running starts them after the upgrade).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from gpusched.store import Store
from tests.daemon_harness import RunningDaemon, eventually


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants; one that ended meanwhile is no error."""
    process = psutil.Process(pid)
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    with contextlib.suppress(psutil.NoSuchProcess):
        process.kill()
    psutil.wait_procs([process], timeout=10)


def test_a_supervisor_started_under_the_old_module_path_is_readopted(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.05; done; exit 6"
    job_id = daemon.submit("--mem", "1G", "--", "sh", "-c", script)
    supervisor = daemon.supervisor_pid(job_id)
    daemon.stop(signal.SIGKILL)
    # What the previous version leaves: its own supervisor for this job, started as
    # `python -m gpusched.supervisor SPEC` in a session of its own, whose pid the old
    # daemon died before recording.
    _kill_tree(supervisor)
    job_dir = daemon.root / "state" / "jobs" / str(job_id)
    (job_dir / "supervisor.json").unlink()  # the new zygote's record: the old one had none
    # The spec the old launcher wrote (a supervisor now deletes it once read).
    spec = {
        "job_id": job_id,
        "argv": ["sh", "-c", script],
        "cwd": "/",
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": [],
        "umask": 0o022,
        "log_path": str(daemon.root / "logs" / f"{job_id}.log"),
        "kill_grace_s": 2.0,
        "max_log_bytes": None,
        "time_limit_s": None,
    }
    (job_dir / "spec.json").write_text(json.dumps(spec))
    old = subprocess.Popen(
        [sys.executable, "-m", "gpusched.supervisor", str(job_dir / "spec.json")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    store = Store(f"sqlite:///{daemon.root / 'gpusched.db'}")
    try:
        with store.database.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET pid = NULL, pid_start_time = NULL WHERE id = ?", (job_id,)
            )
    finally:
        store.close()
    eventually(lambda: psutil.Process(old.pid).children())  # it has started the job
    daemon.start()
    assert f"job {job_id} still running (pid {old.pid}): re-adopted" in daemon.stderr()
    go.touch()
    assert daemon.cli("wait", str(job_id), timeout=60).returncode == 6
    old.wait(timeout=10)
    job = daemon.show(job_id)
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit", 6)


def test_the_old_entry_points_still_run() -> None:
    for module in ("gpusched.supervisor", "gpusched.zygote"):
        result = subprocess.run(
            [sys.executable, "-m", module],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "No module named" not in result.stderr, result.stderr
        assert result.returncode != 0  # no arguments: its usage, from the new module
