"""What else a root daemon serving untrusted local users could get wrong (issue 16's last line).

Each test plays mallory (an unprivileged local user) against a root daemon under the
unit's limits, then checks the promise held: nothing of root's or the victim's reached
her, the victim's jobs ran as submitted, the daemon still schedules.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpusched.client import Client
from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import load_config
from gpusched.core.errors import GpuschedError
from gpusched.processes.launcher import Launcher, find_supervisor
from gpusched.processes.pidref import process_start_time
from tests.daemon_harness import RunningDaemon, directory_settings, eventually
from tests.users import User, as_user

SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter is not reachable by other users


def test_a_users_process_named_like_a_supervisor_is_never_adopted(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """A restarted daemon looks for a job's unrecorded supervisor by its command line.

    Anyone can give a process that command line: mallory runs `python3 -m
    gpusched.processes.supervisor <the victim's spec path>` (a module of her own on PYTHONPATH that
    ignores SIGTERM). Adopted, it would keep the victim's job `running` for as long as she
    likes, never run it, take her signals for the victim's cancel and have her GPU memory
    counted as the victim's. Only a process of the daemon's own user is a supervisor.
    """
    mallory, victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path
    job = as_user(
        victim, lambda: Client(socket_path).submit(["true"], mem="1G", hold=True).to_json()
    )
    daemon.stop(signal.SIGKILL)
    daemon.mark_running_without_supervisor(job["id"])
    spec_path = daemon.root / "state" / "jobs" / str(job["id"]) / "spec.json"

    def impostor() -> int:
        fake = _fake_supervisor(Path(mallory.home))
        process = subprocess.Popen(
            [SYSTEM_PYTHON, "-m", "gpusched.processes.supervisor", str(spec_path)],
            env={"PYTHONPATH": str(fake)},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return process.pid

    fake_pid = as_user(mallory, impostor)
    try:
        eventually(lambda: psutil.Process(fake_pid).cmdline()[1:2] == ["-m"])
        daemon.start()
        done = daemon.wait_state(job["id"], {"done", "failed", "lost", "cancelled"})
        assert (done["state"], done["reason"]) == ("done", "exit"), done
        assert done["pid"] != fake_pid
        assert f"(pid {fake_pid}): re-adopted" not in daemon.stderr()
    finally:
        psutil.Process(fake_pid).kill()


def _fake_supervisor(home: Path) -> Path:
    """A module `gpusched.processes.supervisor` that only sleeps, importable from the
    returned dir."""
    fake = home / "fake" / "gpusched" / "processes"
    fake.mkdir(parents=True, exist_ok=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    # It ignores SIGTERM: an adopted impostor would outlive the victim's cancel.
    (fake / "supervisor.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    )
    return fake.parent.parent


def test_find_supervisor_takes_the_daemons_own_process_not_a_users(
    people: tuple[User, User], tmp_path: Path
) -> None:
    """The same command line, as root (a directly started supervisor) and as mallory."""
    mallory, _victim = people
    spec_path = tmp_path / "jobs" / "7" / "spec.json"
    argv = [SYSTEM_PYTHON, "-m", "gpusched.processes.supervisor", str(spec_path)]

    def as_mallory() -> int:
        path = _fake_supervisor(Path(mallory.home))
        env = {"PYTHONPATH": str(path)}
        return subprocess.Popen(argv, env=env, start_new_session=True).pid

    theirs = psutil.Process(as_user(mallory, as_mallory))
    try:
        eventually(lambda: theirs.cmdline()[1:] == argv[1:])
        assert find_supervisor(spec_path) is None
        fake = str(_fake_supervisor(tmp_path))
        # Not from the repository: `-m` puts the working directory first on sys.path.
        ours = subprocess.Popen(argv, env={"PYTHONPATH": fake}, cwd=tmp_path)
        try:
            eventually(lambda: psutil.Process(ours.pid).cmdline()[1:] == argv[1:])
            assert find_supervisor(spec_path) == ours.pid
        finally:
            ours.kill()
            ours.wait()
    finally:
        theirs.kill()


JOB_PROBE = r"""
import json, os, sys
state, daemon_pid = sys.argv[1], int(sys.argv[2])
supervisor = os.getppid()
def tried(fn):
    try:
        fn()
        return "done"
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({
    "fds": sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")),
    "tried": {
        "signal the supervisor": tried(lambda: os.kill(supervisor, 0)),
        "signal the daemon": tried(lambda: os.kill(daemon_pid, 0)),
        "read the supervisor's environment":
            tried(lambda: open(f"/proc/{supervisor}/environ").read()),
        "list the daemon's descriptors": tried(lambda: os.listdir(f"/proc/{daemon_pid}/fd")),
        "read its own spec": tried(lambda: open(f"{state}/spec.json").read()),
        "forge its exit record": tried(lambda: open(f"{state}/exit.json", "w")),
        "plant a link at its exit record's temporary name":
            tried(lambda: os.symlink("/etc/shadow", f"{state}/exit.json.tmp")),
    },
}))
"""


def test_a_job_holds_no_root_descriptor_and_cannot_reach_its_supervisor_or_records(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Inside its job, mallory finds only her log and /dev/null open; the supervisor, the
    daemon and the job's spec and exit record (root's) are out of her reach; her log is
    hers alone whatever umask she submits with."""
    mallory, _victim = people
    daemon = root_daemon()
    assert daemon.process is not None
    socket_path, daemon_pid = daemon.socket_path, daemon.process.pid
    state = daemon.root / "state" / "jobs" / "1"
    argv = [SYSTEM_PYTHON, "-c", JOB_PROBE, str(state), str(daemon_pid)]
    # Submitted with umask 0: her job's own files would be open to all, never its log.
    job = as_user(mallory, lambda: Client(socket_path).submit(argv, mem="1G").to_json(), umask=0)
    assert job["id"] == 1
    done = daemon.wait_state(job["id"], {"done", "failed"})
    assert done["state"] == "done", daemon.log(job["id"])
    seen = json.loads(daemon.log(job["id"]))
    assert seen["fds"] == ["/dev/null", done["log_path"], done["log_path"]]
    assert set(seen["tried"].values()) <= {"PermissionError"}, seen["tried"]
    assert json.loads((state / "exit.json").read_text())["exit_code"] == 0
    assert stat.S_IMODE(os.stat(done["log_path"]).st_mode) == 0o600


def _views_of(
    user: User, socket_path: Path, job_id: int, array_id: int | None
) -> list[dict[str, Any]]:
    """Every reply in which `user` can see the job: show, array, wait, history, status."""

    def ask() -> list[dict[str, Any]]:
        client = Client(socket_path)
        replies = [client.request("show", id=job_id)]
        if array_id is not None:
            replies += client.request("array", array=array_id)
        replies += client.request("wait", ids=[job_id], timeout=0)
        replies += client.request("history", limit=100)
        replies += client.request("status", all=True)["jobs"]
        return [r for r in replies if r["id"] == job_id]

    return list(as_user(user, ask))


def test_mallory_can_neither_steer_nor_read_the_victims_jobs_through_any_request(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Beyond test_multiuser's cancel/hold/release/logs: priority, requeue, an array's
    cancel, and every reply that lists a job (commands, directories and hooks hidden)."""
    mallory, victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path

    def victims_jobs() -> list[dict[str, Any]]:
        client = Client(socket_path)
        ended = client.submit(["true"], mem="1G", notify="mail victim@lab.org")
        array = client.submit_sweep(
            ["sleep", "{s}"], [("s", ["30", "31"])], mem="1G", hold=True, notify="x"
        )
        return [ended.to_json(), *(job.to_json() for job in array)]

    ended, *array = as_user(victim, victims_jobs)
    array_id = array[0]["array_id"]
    daemon.wait_state(ended["id"], {"done"})
    attempts = {
        "priority": {"id": array[0]["id"], "priority": 10**6},
        "requeue": {"id": ended["id"]},
        "cancel": {"array": array_id},
        "release": {"id": array[1]["id"]},
    }
    for op, args in attempts.items():
        refused = as_user(mallory, functools.partial(_refused, socket_path, op, args))
        assert refused == "PermissionDenied", (op, refused)
    for job in (ended, array[0]):
        for seen in _views_of(mallory, socket_path, job["id"], array_id):
            assert (seen["command"], seen["cwd"], seen["notify"]) == (
                ["(hidden)"],
                None,
                ["(hidden)"],
            )
    after = [daemon.show(job["id"]) for job in array]
    assert [(j["state"], j["priority"]) for j in after] == [("held", 0), ("held", 0)]
    assert len(daemon.status("--all")["jobs"]) == 3  # nothing requeued


def _refused(socket_path: Path, op: str, args: dict[str, Any]) -> str:
    try:
        Client(socket_path).request(op, **args)
    except GpuschedError as exc:
        return type(exc).__name__
    return "accepted"


def test_an_out_of_memory_line_from_a_private_log_is_not_shown_to_others(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """The victim's log is hers alone (`logs` refuses others); the out-of-memory line the
    daemon picks from it to say why the job failed must stay hers too."""
    mallory, victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path
    line = "token=hunter2 CUDA out of memory. Tried to allocate 2 GiB"
    argv = ["sh", "-c", f"echo '{line}'; exit 1"]
    job = as_user(victim, lambda: Client(socket_path).submit(argv, mem="1G").to_json())
    ended = daemon.wait_state(job["id"], {"failed"})
    assert ended["reason"] == "oom" and "hunter2" in ended["reason_detail"]  # hers: she sees it
    for seen in _views_of(mallory, socket_path, job["id"], None):
        assert "hunter2" not in json.dumps(seen), seen


def test_a_recorded_pid_reused_by_a_victims_process_is_never_signalled(
    people: tuple[User, User], tmp_path: Path
) -> None:
    """A job's supervisor is known by pid and start time. After its end (and a daemon
    restart), that pid may be the victim's process: cancel must not signal it, whoever's
    job the stale record belongs to. Here the victim's process has the recorded pid but
    not the recorded start time (as a reused pid would)."""
    _mallory, victim = people

    def victims_process() -> int:
        argv = ["sleep", "60"]
        return subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL).pid

    pid = as_user(victim, victims_process)
    launcher = Launcher(ConfigHolder(load_config(None, directory_settings(tmp_path))))
    try:
        started = process_start_time(pid)
        assert started is not None
        stale = repr(float(started) - 1.0)  # the supervisor that had this pid before
        assert launcher.cancel(pid, stale) is False
        assert launcher.cancel(pid, None) is False
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        launcher.close()
        psutil.Process(pid).kill()
