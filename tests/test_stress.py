"""Stress: 16 clients submit short jobs while the daemon is SIGKILLed and restarted.

What must hold however the kills fall:
- every submit the daemon acknowledged is in the database (persist, then acknowledge);
- no job ran twice (each job appends its own id to one shared file);
- every job that ended with reason `exit` has the exit code its id implies;
- jobs running when the daemon died are re-adopted: their real exit codes are recorded.

Scale: here 320 jobs (20 per client) through 4 SIGKILLs, enough for every kill to fall
among submits, starts and ends (the daemon gets through about 10 of these jobs a second
on 2 cores, restarts included: each job is a Python supervisor, a shell and a `sleep`).
The soak of 2,000 jobs through 6 kills is `python benchmarks/soaks.py`, which runs this
test with GPUSCHED_STRESS_JOBS and GPUSCHED_STRESS_RESTARTS set; either sets any size.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import random
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.client import Client
from gpusched.core.errors import DaemonUnreachable, GpuschedError, ProtocolError
from gpusched.core.models import Job
from tests.daemon_harness import RunningDaemon, eventually

pytestmark = pytest.mark.stress  # skipped locally with -m "not stress"; CI runs it

CLIENTS = 16
JOBS = int(os.environ.get("GPUSCHED_STRESS_JOBS", "320"))
RESTARTS = int(os.environ.get("GPUSCHED_STRESS_RESTARTS", "4"))
KILL_EVERY_S = (4.0, 7.0)  # seconds between a restart and the next SIGKILL
DOWN_S = (0.05, 0.8)  # how long the daemon stays dead
MAX_BACKLOG = 48  # acknowledged jobs not yet started, so submits span the whole run
DRAIN_TIMEOUT_S = max(240.0, JOBS * 0.3)  # ~10 jobs/s here; room for a slower machine
STALL_S = 60.0
PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> None:
    """Adopt the orphans of a SIGKILLed daemon (its jobs' supervisors) so they can be reaped.

    Without this they are re-parented to PID 1, which in some containers never reaps:
    they would linger as zombies after the test, unaccountable.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_orphans(keep: set[int]) -> None:
    """Reap exited children that no Popen object owns (adopted supervisors)."""
    for child in psutil.Process().children():
        if child.pid in keep:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def _ours(marker: str, daemon_pid: int | None = None) -> list[psutil.Process]:
    """Live supervisors of this test's daemon and their job trees.

    The running daemon's own supervisor zygote (its child) is not a job's: it is left out;
    the supervisors it forked name their spec in their title and are counted.
    """
    found = []
    for process in psutil.process_iter(["cmdline", "status", "ppid"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = process.info.get("cmdline") or []
        if process.info["ppid"] == daemon_pid and "gpusched.processes.zygote" in cmdline:
            continue
        if any(marker in part for part in process.info.get("cmdline") or []):
            found.append(process)
            with contextlib.suppress(psutil.Error):
                found.extend(c for c in process.children(recursive=True) if c.status() != "zombie")
    return found


class Stress:
    def __init__(self, daemon: RunningDaemon, workdir: Path) -> None:
        self.daemon = daemon
        self.ran_file = workdir / "ran.txt"
        self.ran_file.touch()
        self.workdir = workdir
        self.argv = [
            "sh",
            "-c",
            # One job in 8 runs for 3 s, so that some are still running when the daemon
            # comes back and must be re-adopted, not only settled from their exit record.
            f"echo $GPUSCHED_JOB_ID >> {self.ran_file};"
            " if [ $((GPUSCHED_JOB_ID % 8)) -eq 0 ]; then sleep 3; else sleep 0.2; fi;"
            " exit $((GPUSCHED_JOB_ID % 3))",
        ]
        self.env = {"PATH": os.environ["PATH"]}
        self.lock = threading.Lock()
        self.acknowledged: list[int] = []
        self.attempts = 0
        self.refused = 0  # submits tried while the daemon was down
        self.unanswered = 0  # submits whose reply was lost: committed or not, we cannot know
        self.unexpected: list[str] = []
        self.started = 0  # lines in ran_file, refreshed by the clients
        self.running_at_kill: set[int] = set()
        self.restarts = 0
        self.submitting = True
        self.last_ack = time.monotonic()  # clients give up after STALL_S without one

    def started_count(self) -> int:
        return self.ran_file.read_bytes().count(b"\n")

    def client_loop(self, quota: int) -> None:
        client = Client(self.daemon.socket_path)
        done = 0
        while done < quota:
            if time.monotonic() - self.last_ack > STALL_S:
                with self.lock:
                    self.unexpected.append(f"gave up: no submit acknowledged for {STALL_S}s")
                return
            with self.lock:
                backlog = len(self.acknowledged) - self.started
            if backlog > MAX_BACKLOG:
                time.sleep(0.05)
                with self.lock:
                    self.started = self.started_count()
                continue
            with self.lock:
                self.attempts += 1
            try:
                job = client.submit(self.argv, mem="1G", cwd=self.workdir, env=self.env)
            except (DaemonUnreachable, ProtocolError) as exc:
                if isinstance(exc, ProtocolError) and "closed" not in exc.message:
                    with self.lock:
                        self.unexpected.append(f"submit: {exc.kind}: {exc.message}")
                    return
                # Refused: the daemon is down, nothing was committed. Otherwise it died
                # before its reply was complete: the job may or may not exist.
                with self.lock:
                    if exc.message.startswith("cannot reach"):
                        self.refused += 1
                    else:
                        self.unanswered += 1
                time.sleep(random.uniform(0.02, 0.1))
                continue
            except GpuschedError as exc:
                with self.lock:
                    self.unexpected.append(f"submit: {exc.kind}: {exc.message}")
                return
            with self.lock:
                self.acknowledged.append(job.id)
                self.last_ack = time.monotonic()
            done += 1

    def killer_loop(self) -> None:
        client = Client(self.daemon.socket_path)
        while self.restarts < RESTARTS or self.submitting:
            time.sleep(random.uniform(*KILL_EVERY_S))
            if self.restarts >= RESTARTS:
                continue  # enough kills: let the clients finish
            with contextlib.suppress(GpuschedError):
                running = {j.id for j in client.status().jobs if j.state == "running"}
                self.running_at_kill |= running
            self.daemon.stop(signal.SIGKILL)
            time.sleep(random.uniform(*DOWN_S))
            self.daemon.start()
            self.restarts += 1


def _all_jobs(client: Client) -> dict[int, Job]:
    jobs = client.history(limit=10000)
    return {job.id: job for job in jobs}


def test_sigkill_restarts_under_concurrent_submits_lose_and_repeat_nothing(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(
        simulate="4x80G", config={"poll_interval": "0.2s", "kill_grace": "2s"}
    ).start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    stress = Stress(daemon, workdir)
    marker = str(daemon.root / "state")
    began = time.monotonic()
    _set_subreaper(True)
    try:
        quotas = [JOBS // CLIENTS + (i < JOBS % CLIENTS) for i in range(CLIENTS)]
        clients = [
            threading.Thread(target=stress.client_loop, args=(q,), name=f"client-{i}")
            for i, q in enumerate(quotas)
        ]
        killer = threading.Thread(target=stress.killer_loop, name="killer")
        for thread in [*clients, killer]:
            thread.start()
        for thread in clients:
            thread.join()
        submitted_by = time.monotonic() - began
        stress.submitting = False
        killer.join()
        assert not stress.unexpected, stress.unexpected[:5]

        # A last restart, then every job must end.
        daemon.stop(signal.SIGKILL)
        daemon.start()
        client = daemon.client()
        eventually(
            lambda: not client.status().jobs,
            DRAIN_TIMEOUT_S,
            interval=0.25,
            describe=lambda: [(j.id, j.state) for j in client.status().jobs[:10]],
        )
        duration = time.monotonic() - began

        jobs = _all_jobs(client)
        ran = collections.Counter(int(line) for line in stress.ran_file.read_text().split())

        # Persist, then acknowledge: every acknowledged submit exists, each once.
        assert len(set(stress.acknowledged)) == len(stress.acknowledged) == JOBS
        missing = set(stress.acknowledged) - set(jobs)
        assert not missing, sorted(missing)[:20]
        # A submit whose reply was lost may have been committed: at most one job each.
        extra = set(jobs) - set(stress.acknowledged)
        assert len(extra) <= stress.unanswered

        # Ran at most once.
        twice = {job_id: n for job_id, n in ran.items() if n > 1}
        assert not twice, twice
        assert set(ran) <= set(jobs)

        # Every job ended by its own exit, with the code its id implies.
        by_reason = collections.Counter(j.reason for j in jobs.values())
        lost = [j for j in jobs.values() if j.state == "lost"]
        for job in jobs.values():
            if job.reason != "exit":
                continue
            assert job.exit_code == job.id % 3, job
            assert job.state == ("done" if job.exit_code == 0 else "failed"), job
            assert ran[job.id] == 1, job
        # No job is lost: one whose supervisor had not started when the daemon died is
        # queued again at the restart (scheduler.adopt_running), and runs once.
        assert not lost, [(j.id, j.reason_detail) for j in lost]
        assert by_reason["exit"] == len(jobs), by_reason

        # Jobs running when the daemon died were re-adopted and their real outcome recorded.
        log_text = daemon.stderr()
        for job_id in stress.running_at_kill:
            assert jobs[job_id].reason == "exit", jobs[job_id]
        readopted = [int(i) for i in re.findall(r"job (\d+) still running \(pid \d+\)", log_text)]
        for job_id in readopted:
            assert jobs[job_id].reason == "exit", jobs[job_id]
            assert jobs[job_id].exit_code == job_id % 3, jobs[job_id]
        assert readopted, "no job outlived a restart: nothing was re-adopted"
        requeued = len(re.findall(r"never started before the restart", log_text))
        assert stress.restarts >= RESTARTS

        assert "Traceback" not in log_text, log_text[log_text.index("Traceback") :][:3000]

        print(
            f"\nstress: {CLIENTS} clients, submitted {stress.attempts}, acknowledged"
            f" {len(stress.acknowledged)}, refused (daemon down) {stress.refused},"
            f" reply lost {stress.unanswered} (of which committed"
            f" {len(extra)}), jobs {len(jobs)}, ran {sum(ran.values())}, lost {len(lost)},"
            f" running at a kill {len(stress.running_at_kill)}, re-adopted {len(readopted)},"
            f" queued again (supervisor not started at the kill) {requeued},"
            f" restarts {stress.restarts + 1}, submits done after {submitted_by:.1f}s,"
            f" duration {duration:.1f}s ({len(jobs) / duration:.1f} jobs/s)"
        )

        # Nothing is left behind: every supervisor and job process is gone.
        daemon_pid = daemon.process.pid if daemon.process is not None else None
        eventually(
            lambda: not _ours(marker, daemon_pid),
            describe=lambda: [p.info for p in _ours(marker, daemon_pid)],
        )
    finally:
        _set_subreaper(False)
        keep = {daemon.process.pid} if daemon.process is not None else set()
        _reap_orphans(keep)
