"""Faults around jobs and the daemon (issue 5).

A job that cannot start ends `failed` with reason `failed_to_start` and a detail naming
the cause, and the daemon lives on to run the next job. SIGTERM stops the daemon but
not the jobs, which the next start re-adopts. SIGHUP reloads the config, keeping the
old one (and saying why) when the new one is broken. A job the daemon marked running
but died before starting is queued again, never run twice, never lost.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import yaml

from gpusched.store import Store
from tests.daemon_harness import RunningDaemon, eventually, job_until

GIB = 2**30


def _failed_to_start(daemon: RunningDaemon, job_id: int, *words: str) -> dict[str, Any]:
    job = daemon.wait_state(job_id, {"done", "failed", "lost", "cancelled"})
    assert (job["state"], job["reason"]) == ("failed", "failed_to_start"), job
    for word in words:
        assert word in job["reason_detail"], job
    human = daemon.cli("show", str(job_id))
    assert human.returncode == 0, human.stderr
    assert "failed_to_start" in human.stdout, human.stdout
    return job


def _still_schedules(daemon: RunningDaemon) -> None:
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", "print('next')")
    job = daemon.wait_state(job_id, {"done", "failed", "lost"})
    assert (job["state"], job["exit_code"]) == ("done", 0), job
    assert daemon.process is not None and daemon.process.poll() is None


def test_jobs_that_cannot_start_fail_naming_the_cause_and_the_daemon_lives_on(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    # The working directory is deleted between submit and start.
    workdir = tmp_path / "gone"
    workdir.mkdir()
    job_id = daemon.submit("--hold", "--mem", "1G", "--cwd", str(workdir), "--", "true")
    workdir.rmdir()
    assert daemon.cli("release", str(job_id)).returncode == 0
    _failed_to_start(daemon, job_id, "working directory", str(workdir), "does not exist")

    # The executable is deleted between submit and start.
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    job_id = daemon.submit("--hold", "--mem", "1G", "--", str(tool))
    tool.unlink()
    assert daemon.cli("release", str(job_id)).returncode == 0
    _failed_to_start(daemon, job_id, "command not found", str(tool))

    # Something that is not a file sits where the job's log goes.
    job_id = daemon.submit("--hold", "--mem", "1G", "--", "true")
    (daemon.root / "logs" / f"{job_id}.log").mkdir(parents=True)
    assert daemon.cli("release", str(job_id)).returncode == 0
    _failed_to_start(daemon, job_id, "cannot open log", f"{job_id}.log")

    # The log directory itself is replaced by a file.
    logs = daemon.root / "logs"
    shutil.rmtree(logs)
    logs.write_text("not a directory\n")
    job_id = daemon.submit("--mem", "1G", "--", "true")
    _failed_to_start(daemon, job_id, str(logs))
    logs.unlink()

    _still_schedules(daemon)
    assert "Traceback" not in daemon.stderr()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_leaves_jobs_running_and_a_restart_readopts_them(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    marker = tmp_path / "finished"
    go = tmp_path / "go"  # it runs until the restarted daemon has re-adopted it
    script = job_until(go, marker, 4)
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", script)
    supervisor = daemon.supervisor_pid(job_id)
    assert daemon.stop(signal.SIGTERM) == 0
    assert _alive(supervisor), "SIGTERM of the daemon must not stop its jobs"
    assert "running jobs keep running" in daemon.stderr()
    daemon.start()
    assert daemon.show(job_id)["state"] == "running"
    assert f"job {job_id} still running (pid {supervisor}): re-adopted" in daemon.stderr()
    go.touch()
    assert daemon.cli("wait", str(job_id), timeout=30).returncode == 4
    job = daemon.show(job_id)
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit", 4)
    assert marker.exists()


def _available(daemon: RunningDaemon) -> int:
    # Through the socket: the CLI itself would read the (broken) config file.
    return daemon.client().status().gpus[0].available


def _reload(daemon: RunningDaemon, settings: dict[str, Any] | str | bytes, expect: str) -> None:
    if isinstance(settings, bytes):
        daemon.config_path.write_bytes(settings)
    else:
        text = settings if isinstance(settings, str) else yaml.safe_dump(settings)
        daemon.config_path.write_text(text)
    before = daemon.stderr().count(expect)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGHUP)
    eventually(lambda: daemon.stderr().count(expect) > before, 30, describe=daemon.stderr)


def test_sighup_applies_a_valid_config_and_keeps_the_old_one_when_broken(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(simulate="1x24G").start()
    settings = yaml.safe_load(daemon.config_path.read_text())
    # It answers before its first reading of the card: wait for that reading.
    eventually(lambda: daemon.client().status().gpus, describe=daemon.client().status)
    assert _available(daemon) == 24 * GIB - 512 * 2**20  # the default headroom

    _reload(daemon, {**settings, "headroom": "2G"}, "config reloaded")
    eventually(lambda: _available(daemon) == 22 * GIB, 30, describe=daemon.client().status)

    broken_files: list[tuple[str | bytes, str]] = [
        ("headroom: [unclosed\n", "config reload failed, keeping the old config"),
        (yaml.safe_dump({**settings, "headroom": "lots"}), "headroom"),
        (yaml.safe_dump({**settings, "no_such_key": 1}), "no_such_key"),
        # Latin-1, not UTF-8: a file that cannot be decoded is refused like one that does
        # not parse, and the daemon lives on.
        (yaml.safe_dump(settings).encode() + b"node: caf\xe9\n", "not valid UTF-8 at byte"),
    ]
    for broken, why in broken_files:
        _reload(daemon, broken, "config reload failed")
        failures = [line for line in daemon.stderr().splitlines() if "reload failed" in line]
        assert why in failures[-1], failures[-1]
        assert _available(daemon) == 22 * GIB  # the old config still holds
        assert daemon.process is not None and daemon.process.poll() is None

    # `admin reload` (systemd's ExecReload) is answered with the same one line.
    answer = daemon.cli("--socket", str(daemon.socket_path), "admin", "reload")
    assert answer.returncode == 2, answer.stderr
    assert answer.stderr.count("\n") == 1 and "not valid UTF-8 at byte" in answer.stderr
    assert daemon.process.poll() is None

    # A deleted config file is broken too.
    daemon.config_path.unlink()
    assert daemon.process is not None
    before = daemon.stderr().count("config reload failed")
    daemon.process.send_signal(signal.SIGHUP)
    eventually(
        lambda: daemon.stderr().count("config reload failed") > before, describe=daemon.stderr
    )
    assert _available(daemon) == 22 * GIB
    daemon.config_path.write_text(yaml.safe_dump(settings))
    _still_schedules(daemon)
    assert "Traceback" not in daemon.stderr()


def test_a_reloaded_kill_grace_reaches_the_next_job(daemon_factory: Any) -> None:
    # The launcher writes each job's grace into its supervisor's spec. It once copied
    # kill_grace when the daemon started, so a reload never reached it. (The spec is
    # deleted once read, so the grace is seen at work: a job that ignores SIGTERM ends
    # within the new 1 s grace, far inside the old 600 s.)
    daemon = daemon_factory(simulate="1x24G", config={"kill_grace": "600s"}).start()
    settings = yaml.safe_load(daemon.config_path.read_text())
    _reload(daemon, {**settings, "kill_grace": "1s"}, "config reloaded")
    job_id = daemon.submit("--mem", "1G", "--", "sh", "-c", "trap '' TERM; sleep 600")
    daemon.supervisor_pid(job_id)
    assert daemon.cli("cancel", str(job_id)).returncode == 0
    assert daemon.wait_state(job_id, {"cancelled"}, timeout=120)["state"] == "cancelled"


def _db(daemon: RunningDaemon) -> Store:
    return Store(f"sqlite:///{daemon.root / 'gpusched.db'}")


def test_a_job_marked_running_whose_supervisor_never_started_runs_after_a_restart(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The daemon died between marking a job running and starting its supervisor."""
    ran = tmp_path / "ran"
    job_id = daemon.submit("--hold", "--mem", "1G", "--", "sh", "-c", f"echo x >> {ran}")
    daemon.stop(signal.SIGKILL)
    daemon.mark_running_without_supervisor(job_id)
    daemon.start()
    job = daemon.wait_state(job_id, {"done", "failed", "lost"})
    assert (job["state"], job["reason"], job["exit_code"]) == ("done", "exit", 0), job
    assert ran.read_text() == "x\n"  # once
    assert "never started before the restart: queued again" in daemon.stderr()


def test_a_job_whose_supervisor_vanished_after_opening_its_log_is_lost_not_rerun(
    daemon: RunningDaemon,
) -> None:
    """Its command may have run: running it again could run it twice, so it is lost."""
    job_id = daemon.submit("--hold", "--mem", "1G", "--", "true")
    daemon.stop(signal.SIGKILL)
    log_path = daemon.root / "logs" / f"{job_id}.log"
    log_path.parent.mkdir(exist_ok=True)
    log_path.write_text("")
    daemon.mark_running_without_supervisor(job_id)
    daemon.start()
    job = daemon.show(job_id)
    assert (job["state"], job["reason"]) == ("lost", "lost"), job
    assert "supervisor" in job["reason_detail"]
    assert os.path.exists(log_path)


def test_a_zygote_forked_supervisor_whose_pid_was_never_recorded_is_readopted(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The daemon died after the zygote forked a job's supervisor, before set_pid.

    That supervisor has not the command line of `python -m gpusched.processes.supervisor SPEC`: the
    restarted daemon finds it by the identity the zygote recorded in the job's directory.
    """
    marker = tmp_path / "finished"
    go = tmp_path / "go"  # it runs until the restarted daemon has re-adopted it
    script = job_until(go, marker, 5)
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", script)
    supervisor = daemon.supervisor_pid(job_id)
    assert "gpusched.processes.supervisor" not in " ".join(psutil.Process(supervisor).cmdline())
    daemon.stop(signal.SIGKILL)
    store = _db(daemon)
    try:  # what the database holds when set_pid never committed
        with store.database.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET pid = NULL, pid_start_time = NULL WHERE id = ?", (job_id,)
            )
    finally:
        store.close()
    daemon.start()
    assert f"job {job_id} still running (pid {supervisor}): re-adopted" in daemon.stderr()
    assert daemon.show(job_id)["pid"] == supervisor
    go.touch()
    assert daemon.cli("wait", str(job_id), timeout=30).returncode == 5
    job = daemon.show(job_id)
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit", 5)
    assert marker.exists()


def test_after_a_reboot_a_running_job_without_pid_or_log_is_lost_not_rerun(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """A power cut may take the log's creation (and the pid) with the page cache: then
    the missing log proves nothing, and queueing the job again could run it twice."""
    ran = tmp_path / "ran"
    job_id = daemon.submit("--hold", "--mem", "1G", "--", "sh", "-c", f"echo x >> {ran}")
    daemon.stop(signal.SIGKILL)
    daemon.mark_running_without_supervisor(job_id)
    boot = daemon.root / "state" / "boot.json"
    assert boot.exists(), "the daemon records the boot it runs in"
    boot.write_text('{"boot_id": "another boot"}')  # what a reboot looks like
    daemon.start()
    job = daemon.show(job_id)
    assert (job["state"], job["reason"]) == ("lost", "lost"), job
    assert not ran.exists()
    assert "never started before the restart" not in daemon.stderr()
