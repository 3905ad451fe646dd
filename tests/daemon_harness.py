"""A real gpusched daemon in a temporary directory, driven in-process or through the CLI.

Each `RunningDaemon` has its own config file, socket, SQLite database, state and log
directories, so tests never touch system paths and never share state.

How a test talks to it (the daemon is always a real process; what differs is the caller):

- `submit`, `show`, `status`, `log`, `wait_state`, `wait_reason`, `supervisor_pid`: from
  this process, through `gpusched.Client` (the socket's peer is the test process: root
  in CI). `submit` and `status` take the command line's own words ("--mem", "8G", "--",
  ...), parsed by the real click command, and return what `submit` / `status --json` /
  `show --json` print (the same view functions), at 1 ms rather than a Python start.
- `fork=True` on `submit`, `show` and `status`, or `cli(...)`: a real `python -m
  gpusched` process, for a test of the command line itself (its words, exit codes,
  output) or a call that must come from another process or user (`user=`, `group=`,
  `preexec_fn=`, ... go to subprocess.run; an in-process call would be root's, past
  owner checks and budgets).

`start()` waits until the daemon answers on its socket, or fails at once with its
stderr when it exits; only a daemon that lives and never answers meets `start_timeout()`.
"""

from __future__ import annotations

import contextlib
import hashlib
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

T = TypeVar("T")

# A live daemon that has not answered for this long, on an idle machine, is stuck rather
# than slow; the bound grows with the machine's load (start_timeout).
START_TIMEOUT_BASE_S = 30.0
START_TIMEOUT_MAX_S = 120.0
# What a call through the in-process client may pass on to the command line's process.
IN_PROCESS_KWARGS = frozenset({"env", "cwd"})


def start_timeout() -> float:
    """How long `RunningDaemon.start` waits for a live daemon to answer: 30 s, and 30 s
    more per unit of load per CPU, at most 120 s. A daemon that exits fails at once."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average here: assume the worst
        return START_TIMEOUT_MAX_S
    return min(START_TIMEOUT_MAX_S, START_TIMEOUT_BASE_S * max(1.0, 1.0 + load))


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


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """`gpusched ARGS` in a fresh process with this environment: its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


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
        self.wait_ready(self.process)
        return self

    def wait_ready(self, process: subprocess.Popen[bytes], timeout: float | None = None) -> None:
        """Until the daemon answers a ping; RuntimeError with its stderr as soon as it exits,
        AssertionError if it lives `timeout` (default: start_timeout()) without answering."""
        bound = start_timeout() if timeout is None else timeout

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"daemon exited {process.returncode}: {self.stderr()}")
            # Nothing can answer before the socket exists: no connection attempt till then.
            return self.socket_path.exists() and answers(self)

        eventually(
            ready,
            bound,
            interval=0.02,
            describe=lambda: f"daemon (pid {process.pid}) alive, not answering: {self.stderr()}",
        )

    def wait_gpus_reported(self, node: str | None = None) -> RunningDaemon:
        """Until `status` lists GPUs (of `node`, in a cluster): a node answers before its
        first report reaches the database, and a submit in between finds no GPU there
        (a forked CLI's start used to hide that gap)."""
        eventually(
            lambda: any(g.get("node") == node for g in self.status()["gpus"]),
            start_timeout(),
            describe=lambda: self.status()["gpus"],
        )
        return self

    def stop(self, signum: int = signal.SIGTERM) -> int | None:
        """Signal the daemon and wait for its exit code: as long as a start may take (a
        stop finishes its pass and writes the running jobs' last points, which wait on a
        database that was just cut off); SIGKILLed and TimeoutExpired past that."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=start_timeout())
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self.process = None
            # A daemon stopped without its clean exit leaves its (empty) cpuset directory;
            # its running jobs keep theirs (kill_jobs removes those).
            remove_cpusets(self.root / "state", wait_s=0)

    def kill_jobs(self) -> None:
        """SIGKILL every supervisor of this daemon and its job tree (jobs outlive the daemon),
        then remove the cpusets (cgroup v1) their supervisors had no time to."""
        marker = str(self.root / "state")
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info.get("cmdline") or []
            if any(marker in part for part in cmdline):
                with contextlib.suppress(psutil.Error):
                    for child in process.children(recursive=True):
                        child.kill()
                    process.kill()
        remove_cpusets(self.root / "state")

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
        return run_cli(*args, env=kwargs.pop("env", self.env), timeout=timeout, **kwargs)

    def submit(self, *args: str, fork: bool = False, **kwargs: Any) -> int:
        """`gpusched submit ARGS`: the new job's id (the first, for a --sweep).

        In-process by default (`env=` is the environment the job gets, `cwd=` the
        directory the command line would run in); `fork=True`: the real command line,
        with `kwargs` for subprocess.run (`user=`...)."""
        if fork or not IN_PROCESS_KWARGS.issuperset(kwargs):
            self._check_fork(fork, kwargs)
            result = self.cli("submit", *args, **kwargs)
            assert result.returncode == 0, result.stderr
            return int(result.stdout.split()[0])
        return self.submit_jobs(*args, **kwargs)[0]

    def submit_jobs(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> list[int]:
        """`gpusched submit ARGS` from this process: every id it queued (a --sweep's all).

        The words are parsed by the click command itself and become the request its body
        sends (cli/submit.py); the job gets `env` (default: this daemon's `env`, what the
        command line would have had) and runs in `cwd` (default: this process's)."""
        from gpusched.cli.submit import submit as submit_command
        from gpusched.cli.submit_view import job_options

        with submit_command.make_context("submit", list(args)) as ctx:
            params = dict(ctx.params)
        if params["max_concurrent"] is not None and not params["sweep"]:
            raise AssertionError("--max-concurrent without --sweep: the CLI refuses it")
        here = os.fspath(cwd) if cwd is not None else os.getcwd()
        given_cwd = params["cwd"]
        client = self.client()
        options = job_options(
            mem=params["mem"],
            gpus=params["gpus"],
            name=params["name"],
            priority=params["priority"],
            after=params["after"],
            hold=params["hold"],
            cwd=os.path.join(here, given_cwd) if given_cwd is not None else here,
            time_limit=params["time_limit"],
            notify=params["notify"],
            retry_oom=params["retry_oom"],
            nodes=params["nodes"],
            requeue=params["requeue"],
            exclusive=params["exclusive"],
            share=params["share"],
            output=params["output"],
            array_jobs=lambda array_id: [job.id for job in client.array(array_id)],
        )
        command = list(params["command"])
        job_env = dict(self.env if env is None else env)
        if params["sweep"]:
            from gpusched.core.requests.sweep import parse_sweep_option

            pairs = [parse_sweep_option(item) for item in params["sweep"]]
            jobs = client.submit_sweep(
                command, pairs, max_concurrent=params["max_concurrent"], env=job_env, **options
            )
            return [job.id for job in jobs]
        return [client.submit(command, env=job_env, **options).id]

    def show(self, job_id: int, *, fork: bool = False) -> dict[str, Any]:
        """`gpusched show --json ID` (in-process: the same view of the daemon's reply)."""
        if fork:
            result = self.cli("show", "--json", str(job_id))
            assert result.returncode == 0, result.stderr
            return dict(json.loads(result.stdout))
        from gpusched.cli.show_view import show_json, show_wire

        return dict(json.loads(show_json(self.client().request("show", **show_wire(job_id)))))

    def status(self, *args: str, fork: bool = False) -> dict[str, Any]:
        """`gpusched status --json ARGS` (in-process: the click command's parsing and
        its fetch_status / status_json, through the client)."""
        if fork:
            result = self.cli("status", "--json", *args)
            assert result.returncode == 0, result.stderr
            return dict(json.loads(result.stdout))
        import pwd

        from gpusched.cli.status_view import fetch_status, status_json
        from gpusched.cli.views import status as status_command

        with status_command.make_context("status", ["--json", *args]) as ctx:
            params = dict(ctx.params)
        assert not params["watch"], "status --watch: use cli()"
        user = pwd.getpwuid(os.getuid()).pw_name if params["mine"] else params["user"]
        reply = fetch_status(
            self.client(),
            targets=params["targets"],
            as_json=True,
            show_all=params["show_all"],
            limit=params["limit"],
            user=user,
        )
        return dict(json.loads(status_json(reply)))

    @staticmethod
    def _check_fork(fork: bool, kwargs: dict[str, Any]) -> None:
        if not fork:  # say so, rather than fork silently and lose the speed
            raise TypeError(
                f"{sorted(set(kwargs) - IN_PROCESS_KWARGS)} need a process: pass fork=True"
            )

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

    def log(self, job_id: int, *, fork: bool = False) -> str:
        """`gpusched logs ID`: the output so far (in-process: the same chunks, read as the
        command's text output reads, newlines made universal)."""
        if fork:
            result = self.cli("logs", str(job_id))
            assert result.returncode == 0, result.stderr
            return result.stdout
        client, chunks, offset = self.client(), [], 0
        while (chunk := client.logs(job_id, offset)).data:
            chunks.append(chunk.data)
            offset = chunk.offset
        text = b"".join(chunks).decode()
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def active_jobs(self) -> list[dict[str, Any]]:
        """Every job not ended (running, queued, held), whoever's."""
        return [j for j in self.status()["jobs"] if j["state"] in ("running", "queued", "held")]


def remove_cpusets(state_dir: Path, wait_s: float = 5.0) -> None:
    """The v1 cpuset directory of the daemon of `state_dir` and its jobs' (once empty,
    waited for up to `wait_s`), as gpusched.processes.cpusets names it; nothing where
    there is none."""
    tag = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:12]
    for root in Path("/sys/fs/cgroup").glob(f"*/gpusched-{tag}"):
        deadline = time.monotonic() + wait_s
        for job in root.glob("job-*"):
            while True:
                try:
                    job.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        with contextlib.suppress(OSError):
            root.rmdir()
