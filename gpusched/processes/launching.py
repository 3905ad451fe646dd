"""What the scheduler knows of a launcher: its interface and the values it returns.

`JobLauncher` is the seam between scheduling and processes: the daemon's `Launcher`
(gpusched.processes.launcher) implements it with zygotes, supervisors and pidfds; tests implement
it in memory (tests/fakes.py) to drive `Scheduler.tick()` without spawning a process.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpusched.core.models import Job, _StrEnum


@dataclass(frozen=True)
class Started:
    pid: int
    start_time: str
    log_path: str
    via: str = "popen"  # zygote: forked by the zygote; popen: a fresh interpreter


class OutcomeKind(_StrEnum):
    """How a supervisor says its job ended (the `outcome` of its exit record)."""

    EXIT = "exit"
    SIGNAL = "signal"
    CANCELLED = "cancelled"  # stopped on the daemon's request (a cancel, an overrun kill)
    TIMEOUT = "timeout"  # the supervisor stopped it at its time limit
    HOST_OOM = "host_oom"  # the kernel killed its processes for the service's memory
    FAILED_TO_START = "failed_to_start"
    LOST = "lost"  # no record: the supervisor died without writing one

    @classmethod
    def read(cls, value: object) -> OutcomeKind:
        """An exit record's `outcome`; an unknown one (a newer supervisor's) reads as lost."""
        try:
            return cls(value)
        except ValueError:
            return cls.LOST


@dataclass(frozen=True)
class Outcome:
    """How a job's supervisor says the job ended (None fields: unknown)."""

    kind: OutcomeKind
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None
    # failed_to_start for want of tasks or memory (the service's limit was full): the
    # command never ran, so the job may wait in the queue and start again.
    transient: bool = False
    # How long it ran, in seconds, on the supervisor's monotonic clock; None: not known.
    run_s: float | None = None
    # The most host memory its cgroup held at once, and its processes' CPU time (user and
    # system, seconds); None: not known.
    host_peak_bytes: int | None = None
    cpu_s: float | None = None


# Errors of starting a job that pass (out of files, memory, tasks or disk space): the job
# waits in the queue for the next pass instead of failing.
TRANSIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOSPC, errno.EDQUOT}
)


class StartError(Exception):
    """The job could not be handed to a supervisor (the message is for the job's owner).

    `transient`: it failed for want of a resource, before any supervisor existed, so the
    job may be queued again.
    """

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def start_error(what: str, exc: OSError) -> StartError:
    """A StartError for an OS error, transient when it is one of TRANSIENT_ERRNOS."""
    return StartError(f"{what}: {exc}", transient=exc.errno in TRANSIENT_ERRNOS)


@dataclass(frozen=True)
class HostFacts:
    """What this server can give its jobs, as the launcher found it at start: its memory,
    what the service's memory limit leaves the jobs (None: no job cgroups to count it,
    or no limit below the machine's), its cores a job's cpuset may take, its GPU count.
    `no_memory` and `no_cpuset`: why a job's `--ram` or `--cpus` could not be enforced
    here (None: they can)."""

    total_bytes: int = 0
    service_bytes: int | None = None
    cores: tuple[int, ...] = ()
    gpu_count: int = 1
    no_memory: str | None = "no job cgroups"
    no_cpuset: str | None = "no job cgroups"


class JobLauncher(Protocol):
    """Starts, watches and stops job supervisors; the scheduler's only way to processes."""

    # Called with a job's id, from another thread, once its supervisor has exited.
    on_exit: Callable[[int], None]

    def log_path(self, job_id: int) -> Path: ...

    def host_facts(self) -> HostFacts:
        """This server's memory and cores for the host rule, and whether its jobs' `--ram`
        and `--cpus` are enforced (a cgroup of their own)."""
        ...

    def confine_client(
        self, job: Job, pid: int, start_time: str | None, deny: Sequence[str] = ()
    ) -> None:
        """An interactive job's client process `pid` (started at `start_time`) into
        cgroups of the job's own, held to its `ram` and `cpus` and denied the device
        nodes `deny` names (the other cards'); StartError where they cannot be made, or
        the process has gone."""
        ...

    def release_client(self, job_id: int) -> None:
        """An interactive job's cgroups, once it has ended."""
        ...

    @property
    def fences_devices(self) -> bool:
        """Whether a job started now is kept off the cards it was not given
        (gpusched.processes.devices): CUDA then numbers only the job's own cards."""
        ...

    def start(
        self,
        job: Job,
        env: dict[str, str],
        umask: int,
        gid: int,
        *,
        exec_by: float | None = None,
        deny_devices: Sequence[str] = (),
    ) -> Started:
        """Hand the job to a new supervisor; raises StartError (a message for the owner).
        `exec_by`: a CLOCK_MONOTONIC time past which the supervisor must not start the
        command (a cluster node's launch deadline); it then records a transient
        failed_to_start, and the job goes back to the queue. `deny_devices`: the
        `devices.deny` rules of the cards the job was not given (processes.devices)."""
        ...

    def watch(self, job_id: int, pid: int, start_time: str | None = None) -> None:
        """Call on_exit(job_id) once `pid` exits (also for a supervisor adopted at restart);
        `start_time` tells it from a later process with its pid while it has to be polled."""
        ...

    def outcome(self, job_id: int) -> Outcome:
        """How the job ended, from its supervisor's record; `lost` when there is none."""
        ...

    def cancel(self, pid: int, start_time: str | None) -> bool:
        """Ask a supervisor to stop its job; False if that process is gone."""
        ...

    def find_supervisor(self, job_id: int) -> int | None:
        """A live supervisor of the job whose pid was never recorded (a daemon crash)."""
        ...

    def start_time(self, pid: int) -> str | None: ...

    def is_running(self, pid: int, start_time: str | None) -> bool: ...

    def start_zygote(self) -> None: ...

    def close(self) -> None: ...
