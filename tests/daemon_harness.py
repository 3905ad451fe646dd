"""A real gpusched daemon in a temporary directory, driven through the real CLI.

Each `RunningDaemon` has its own config file, socket, SQLite database, state and log
directories, so tests never touch system paths and never share state.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml

from gpusched.client import Client
from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import load_config
from gpusched.gpus.probe import SimulatedProbe
from gpusched.processes.launcher import Launcher
from gpusched.scheduling.context import Context
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import Store

START_TIMEOUT_S = 15.0
T = TypeVar("T")


def eventually(
    check: Callable[[], T],
    timeout: float = 10.0,
    *,
    interval: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll `check` until it returns something true; return that.

    The one polling loop of the tests: fails after `timeout` seconds, saying what
    `describe()` returns (the state worth seeing when it did not happen).
    """
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            seen = f": {describe()}" if describe is not None else ""
            raise AssertionError(f"condition not met within {timeout}s{seen}")
        time.sleep(interval)
    return value


def job_until(go: Path, marker: Path, code: int) -> str:
    """A job's Python that runs until the test creates `go`, then writes `marker` and exits
    `code`: a job that outlives a daemon restart however slow the machine, with no sleep."""
    return (
        f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit({code})"
    )


def answers(daemon: RunningDaemon) -> bool:
    """Whether the daemon answers a ping now."""
    try:
        daemon.client().ping()
    except Exception:
        return False
    return True


def read_until_closed(fd: int, timeout_s: float = 30.0) -> bytes:
    """Everything written to a pseudo-terminal's (or pipe's) other end until it is closed,
    or until nothing arrives for `timeout_s`; closes `fd`."""
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def directory_settings(root: Path, simulate: str | None = "2x24G") -> dict[str, Any]:
    """Config keys that keep a daemon's socket, database, state and logs under `root`."""
    settings: dict[str, Any] = {
        "socket": str(root / "gpusched.sock"),
        "database": f"sqlite:///{root / 'gpusched.db'}",
        "state_dir": str(root / "state"),
        "log_dir": str(root / "logs"),
    }
    if simulate:
        settings["simulate"] = simulate
    return settings


def in_process_scheduler(root: Path, simulate: str, **overrides: Any) -> Scheduler:
    """A real Scheduler (store, simulated GPUs, launcher) in this process, under `root`.

    Close it with `scheduler.context.launcher.close()` and `scheduler.store.close()`.
    """
    holder = ConfigHolder(load_config(None, {**directory_settings(root, simulate), **overrides}))
    context = Context.build(
        holder,
        Store(holder.current.database_url),
        SimulatedProbe.from_spec(simulate),
        Launcher(holder),
    )
    return Scheduler(context)


class RunningDaemon:
    def __init__(
        self,
        root: Path,
        simulate: str | None = "2x24G",
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.root = root
        # Run in the daemon's process before exec: the security suite applies the systemd
        # unit's limits there (umask, open files, a task and memory cgroup).
        self.preexec = preexec
        self.config_path = root / "config.yaml"
        self.stderr_path = root / "daemon.stderr"
        settings = {
            **directory_settings(root, simulate),
            "poll_interval": "1s",
            "kill_grace": "2s",
            **(config or {}),
        }
        self.socket_path = Path(settings["socket"])
        self.config_path.write_text(yaml.safe_dump(settings))
        self.env = {**os.environ, "GPUSCHED_CONFIG": str(self.config_path), **(env or {})}
        self.env.pop("GPUSCHED_SOCKET", None)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *extra_args: str) -> RunningDaemon:
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpusched", "daemon", *extra_args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=self.preexec,  # noqa: PLW1509 (a few syscalls, no locks or threads)
            )
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"daemon exited {process.returncode}: {self.stderr()}")
            return answers(self)

        eventually(ready, START_TIMEOUT_S, describe=self.stderr)
        return self

    def stop(self, signum: int = signal.SIGTERM) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=15)
        finally:
            self.process = None

    def kill_jobs(self) -> None:
        """SIGKILL every supervisor of this daemon and its job tree (jobs outlive the daemon)."""
        marker = str(self.root / "state")
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info.get("cmdline") or []
            if any(marker in part for part in cmdline):
                with contextlib.suppress(psutil.Error):
                    for child in process.children(recursive=True):
                        child.kill()
                    process.kill()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()
        except FileNotFoundError:
            return ""

    def client(self) -> Client:
        return Client(self.socket_path)

    def cli(
        self, *args: str, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            env=kwargs.pop("env", self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )

    def submit(self, *args: str, **kwargs: Any) -> int:
        result = self.cli("submit", *args, **kwargs)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.strip())

    def show(self, job_id: int) -> dict[str, Any]:
        result = self.cli("show", "--json", str(job_id))
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    def status(self, *args: str) -> dict[str, Any]:
        result = self.cli("status", "--json", *args)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    def wait_state(self, job_id: int, states: set[str], timeout: float = 20) -> dict[str, Any]:
        """Poll until the job is in one of `states` (fails with the last state seen)."""
        seen: list[dict[str, Any]] = []

        def reached() -> dict[str, Any] | None:
            seen[:] = [self.client().job(job_id).to_json()]
            return seen[0] if seen[0]["state"] in states else None

        job = eventually(reached, timeout, describe=lambda: seen)
        assert job is not None  # it is true
        return job

    def wait_reason(self, job_id: int, text: str, timeout: float = 20) -> dict[str, Any]:
        """Poll until a scheduling pass has said why the job waits, in words with `text`."""

        def said() -> dict[str, Any] | None:
            job = self.show(job_id)
            assert job["state"] in ("queued", "held"), job
            return job if text in (job["waiting_reason"] or "") else None

        job = eventually(said, timeout, describe=lambda: self.show(job_id))
        assert job is not None  # it is true
        return job

    def supervisor_pid(self, job_id: int, timeout: float = 10) -> int:
        """The running job's supervisor pid, once recorded (a job is marked running first,
        then started, then its pid is recorded)."""
        self.wait_state(job_id, {"running"})
        return int(eventually(lambda: self.show(job_id)["pid"], timeout))

    def mark_running_without_supervisor(self, job_id: int) -> None:
        """What a daemon SIGKILLed between marking a held job running and recording its
        supervisor's pid leaves in the database (call with the daemon stopped)."""
        store = Store(f"sqlite:///{self.root / 'gpusched.db'}")
        try:
            assert store.jobs.release(job_id)
            assert store.jobs.mark_running(
                job_id,
                gpu_indices=[0],
                gpu_uuids=[],
                pid=None,
                pid_start_time=None,
                log_path=str(self.root / "logs" / f"{job_id}.log"),
                now="2026-01-01T00:00:00.000+00:00",
            )
        finally:
            store.close()

    def log(self, job_id: int) -> str:
        result = self.cli("logs", str(job_id))
        assert result.returncode == 0, result.stderr
        return result.stdout
