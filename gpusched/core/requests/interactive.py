"""The requests of interactive work (`gpusched run`, gpusched.claim()): queue a job whose
process is the caller's own, wait for its placement, report its command's end. The
daemon knows that process from the socket's peer credentials, never from a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpusched.core.errors import UsageError
from gpusched.core.requests.base import JobRequest, Request, check_job_spec, check_sharing, shape


@dataclass(frozen=True)
class RunRequest(Request):
    """Queue an interactive job (`gpusched run`, claim()) whose process is the caller's:
    the daemon takes it from the socket's peer credentials, never from the request."""

    op: ClassVar[str] = "run"
    command: tuple[str, ...] = field(metadata=shape("'command' must be a list of strings"))
    cwd: str
    mem: int | None = None
    gpus: int = 1
    name: str | None = None
    priority: int = 0
    time: float | None = None
    exclusive: bool = False  # `--exclusive`: a card to itself
    share: bool = False  # `--share`: light, shares a busy card
    ram: int | None = None  # `--ram`: host memory, bytes (its process's cgroup)
    cpus: int | None = None  # `--cpus`: cores of its own (its process's cpuset)

    def __post_init__(self) -> None:
        check_sharing(self.exclusive, self.share)
        check_job_spec(
            "run",
            command=self.command,
            cwd=self.cwd,
            mem=self.mem,
            gpus=self.gpus,
            name=self.name,
            time=self.time,
            ram=self.ram,
            cpus=self.cpus,
        )


@dataclass(frozen=True)
class PlacementRequest(JobRequest):
    """The caller's interactive job once placed, or after `timeout` s (the daemon caps it)."""

    op: ClassVar[str] = "placement"
    timeout: float | None = None


@dataclass(frozen=True)
class RunEndedRequest(JobRequest):
    """The caller's interactive command ended: killed by `signal`, else with `exit_code`."""

    op: ClassVar[str] = "run_ended"
    exit_code: int = 0
    signal: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.exit_code <= 255:
            raise UsageError("exit_code must be between 0 and 255")
        if self.signal is not None and not 1 <= self.signal <= 64:
            raise UsageError("signal must be between 1 and 64")
