"""The Python API: one request to the daemon per call, over its Unix socket.

    from gpusched import Client
    job = Client().submit(["python", "train.py"], mem="8G")
    print(Client().wait([job.id])[0].exit_code)

The CLI is built on this. It imports no SQLAlchemy, APScheduler or pynvml.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.config import (
    SYSTEM_CONFIG_PATH,
    SYSTEM_SOCKET_PATH,
    config_path_from_env,
    user_socket_path,
)
from gpusched.errors import DaemonUnreachable, ProtocolError, UsageError
from gpusched.models import TERMINAL_STATES, GpuReport, Job
from gpusched.protocol import decode, encode, error_from_reply, read_frame
from gpusched.units import parse_size

CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 120.0


@dataclass
class Status:
    gpus: list[GpuReport]
    jobs: list[Job]


@dataclass
class LogChunk:
    data: bytes
    offset: int
    ended: bool
    state: str


def resolve_socket(
    explicit: str | os.PathLike[str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> tuple[Path, list[Path]]:
    """The socket to use, and the candidates tried (for the error message)."""
    if explicit:
        return Path(explicit), [Path(explicit)]
    env = os.environ.get("GPUSCHED_SOCKET")
    if env:
        return Path(env), [Path(env)]
    named = config_path_from_env(str(config_path) if config_path else None)
    if named is not None or (os.geteuid() == 0 and SYSTEM_CONFIG_PATH.exists()):
        from gpusched.config import load_config  # reads YAML only when a config is in play

        path = load_config(named).socket_path
        return path, [path]
    candidates = [user_socket_path(), SYSTEM_SOCKET_PATH]
    if os.geteuid() == 0:
        candidates.reverse()
    for candidate in candidates:
        if candidate.exists():
            return candidate, [candidate]
    return candidates[0], candidates


def resolve_command(command: Sequence[str], cwd: str, path_env: str | None) -> list[str]:
    """`train.py` that is not executable runs with the `python` on the submitter's PATH."""
    argv = list(command)
    if not argv:
        raise UsageError("no command given: gpusched submit [OPTIONS] -- COMMAND [ARGS...]")
    first = argv[0]
    if first.endswith(".py"):
        script = Path(cwd, first)
        if not (script.is_file() and os.access(script, os.X_OK)):
            python = shutil.which("python", path=path_env) or shutil.which("python3", path=path_env)
            if python is None:
                raise UsageError(f"cannot run {first}: no python or python3 on your PATH")
            argv.insert(0, python)
    return argv


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Client:
    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.socket_path, self._tried = resolve_socket(socket_path, config_path)

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise the daemon's error as a GpuschedError."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                tried = " or ".join(str(p) for p in self._tried)
                raise DaemonUnreachable(
                    f"cannot reach the gpusched daemon at {tried} ({exc.strerror}):"
                    " is it running? Start it with `gpusched daemon`, or point --socket at it"
                ) from None
            except PermissionError:
                raise DaemonUnreachable(
                    f"cannot reach the gpusched daemon at {self.socket_path}: permission denied"
                ) from None
            sock.settimeout(REPLY_TIMEOUT_S)
            sock.sendall(encode({"op": op, **args}))
            frame = read_frame(sock, bytearray())
        except (TimeoutError, ConnectionResetError, BrokenPipeError) as exc:
            raise DaemonUnreachable(
                f"the gpusched daemon at {self.socket_path} stopped answering ({exc})"
            ) from None
        finally:
            sock.close()
        if frame is None:
            raise DaemonUnreachable(
                f"the gpusched daemon at {self.socket_path} closed the connection"
            )
        reply = decode(frame)
        if reply.get("ok") is True:
            return reply.get("result")
        if reply.get("ok") is False:
            raise error_from_reply(reply)
        raise ProtocolError("the daemon sent a reply without 'ok'")

    def ping(self) -> dict[str, Any]:
        return dict(self.request("ping"))

    def submit(
        self,
        command: Sequence[str],
        *,
        mem: str | int | None = None,
        gpus: int = 1,
        name: str | None = None,
        priority: int = 0,
        after: Sequence[int] = (),
        hold: bool = False,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Job:
        """Queue a command. `mem` is per GPU ("8G" or bytes); None asks for whole GPUs."""
        workdir = os.path.abspath(cwd if cwd is not None else os.getcwd())
        environment = dict(os.environ if env is None else env)
        argv = resolve_command(command, workdir, environment.get("PATH"))
        result = self.request(
            "submit",
            command=argv,
            cwd=workdir,
            env=environment,
            umask=_current_umask(),
            mem=None if mem is None else parse_size(mem),
            gpus=gpus,
            name=name,
            priority=priority,
            after=list(after),
            hold=hold,
        )
        return Job.from_json(result)

    def status(self, all: bool = False) -> Status:
        result = self.request("status", all=all)
        return Status(
            [GpuReport.from_json(g) for g in result["gpus"]],
            [Job.from_json(j) for j in result["jobs"]],
        )

    def job(self, job_id: int) -> Job:
        return Job.from_json(self.request("show", id=job_id))

    def cancel(self, job_id: int) -> Job:
        return Job.from_json(self.request("cancel", id=job_id))

    def hold(self, job_id: int) -> Job:
        return Job.from_json(self.request("hold", id=job_id))

    def release(self, job_id: int) -> Job:
        return Job.from_json(self.request("release", id=job_id))

    def history(self, user: str | None = None, limit: int = 50) -> list[Job]:
        return [Job.from_json(j) for j in self.request("history", user=user, limit=limit)]

    def logs(self, job_id: int, offset: int = 0) -> LogChunk:
        result = self.request("logs", id=job_id, offset=offset)
        return LogChunk(
            base64.b64decode(result["data"]), result["offset"], result["ended"], result["state"]
        )

    def wait(self, job_ids: Sequence[int], timeout: float | None = None) -> list[Job]:
        """Block until every job has ended (or `timeout` seconds pass); return the jobs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
            jobs = [
                Job.from_json(j)
                for j in self.request("wait", ids=list(job_ids), timeout=min(30.0, remaining))
            ]
            if all(job.state in TERMINAL_STATES for job in jobs):
                return jobs
            if deadline is not None and time.monotonic() >= deadline:
                return jobs
