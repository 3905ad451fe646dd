"""The three requests of an interactive job, from the client: queue it for this process
(`run`), wait until it is placed (`placement`, asked again every few seconds so the caller
can show why it waits), and report how its command ended (`run_ended`).

Each is one short request (the client opens a connection per request), so a daemon
restart while the job waits or runs loses nothing: the job is in the database, the
client asks again, and the report of the end is retried until the daemon answers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusched.client import Client
from gpusched.core.errors import ConflictError, DaemonUnreachable, GpuschedError
from gpusched.core.models import TERMINAL_STATES, Job, JobState
from gpusched.core.requests.catalog import (
    CancelRequest,
    PlacementRequest,
    RunEndedRequest,
    RunRequest,
)
from gpusched.core.units import parse_job_mem, parse_job_ram, parse_job_time

PLACEMENT_POLL_S = 2.0  # each `placement` request waits this long, then the reason is shown
REPORT_RETRY_S = 60.0  # how long the end is re-sent to a daemon that does not answer


class NotPlaced(GpuschedError):
    """The job ended (cancelled) before it was placed, or `timeout` passed. The message
    says why it waited (its last waiting reason); `.job` is the job as last seen."""

    def __init__(self, message: str, job: Job | None = None) -> None:
        super().__init__(message)
        self.job = job
        self.waiting_reason = None if job is None else job.waiting_reason


@dataclass
class Placement:
    """Where an interactive job runs and what its process must set in its environment."""

    job: Job
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPUSCHED_JOB_ID, ...
    env_defaults: dict[str, str] = field(default_factory=dict)  # kept if already set
    kill_grace_s: float = 10.0

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def gpu_indices(self) -> list[int]:
        return list(self.job.gpu_indices)

    @property
    def gpu_uuids(self) -> list[str]:
        return list(self.job.gpu_uuids)

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the placement's variables (a default only where `base` has none)."""
        merged = dict(base)
        for key, value in self.env_defaults.items():
            merged.setdefault(key, value)
        merged.update(self.env)
        return merged


def queue(
    client: Client,
    command: Sequence[str],
    *,
    mem: str | int | None = None,
    gpus: int = 1,
    time_limit: str | float | None = None,
    name: str | None = None,
    priority: int = 0,
    exclusive: bool = False,
    share: bool = False,
    ram: str | int | None = None,
    cpus: int | None = None,
) -> Job:
    """Queue an interactive job whose process is this one (`ram`, `cpus`: its host
    memory and cores, this process's cgroup's once it is placed)."""
    if mem is not None:
        mem = parse_job_mem(mem, what="mem")
    if time_limit is not None:
        time_limit = parse_job_time(time_limit, what="time_limit")
    return Job.from_json(
        client.send(
            RunRequest(
                command=tuple(command),
                cwd=os.getcwd(),
                mem=mem,
                gpus=gpus,
                time=time_limit,
                name=name,
                priority=priority,
                exclusive=exclusive,
                share=share,
                ram=None if ram is None else parse_job_ram(ram, what="ram"),
                cpus=cpus,
            )
        )
    )


def wait_placed(
    client: Client,
    job_id: int,
    *,
    timeout_s: float | None = None,
    on_wait: Callable[[Job], None] | None = None,
) -> Placement:
    """Block until the job runs; `on_wait(job)` after each poll while it waits.

    Raises NotPlaced if it ended first (cancelled) or `timeout_s` passed (the job is then
    still queued: the caller cancels it).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait_s = PLACEMENT_POLL_S
        if deadline is not None:
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
        reply = _asked_again(functools.partial(placement, client, job_id, wait_s))
        job = Job.from_json(reply["job"])
        if job.state == JobState.RUNNING:
            return Placement(
                job,
                dict(reply.get("env") or {}),
                dict(reply.get("env_defaults") or {}),
                float(reply.get("kill_grace_s") or 10.0),
            )
        if job.state in TERMINAL_STATES:
            why = f": {job.reason_detail}" if job.reason_detail else ""
            raise NotPlaced(f"job {job.id} ended {job.state} before it started{why}", job)
        if deadline is not None and time.monotonic() >= deadline:
            why = f": {job.waiting_reason}" if job.waiting_reason else ""
            raise NotPlaced(f"job {job.id} was not placed within {timeout_s:g}s{why}", job)
        if on_wait is not None:
            on_wait(job)


def report_end(
    client: Client,
    job_id: int,
    *,
    exit_code: int = 0,
    signal: int | None = None,
    retry_s: float = REPORT_RETRY_S,
) -> Job | None:
    """Tell the daemon how the command ended; retried while the daemon does not answer
    (a restart). None if it never answered: it ends the job `lost` when we are gone."""
    try:
        return Job.from_json(
            _asked_again(
                lambda: client.send(RunEndedRequest(id=job_id, exit_code=exit_code, signal=signal)),
                retry_s,
            )
        )
    except DaemonUnreachable:
        return None


def placement(client: Client, job_id: int, wait_s: float) -> Any:
    return client.send(PlacementRequest(id=job_id, timeout=wait_s))


def _asked_again(request: Callable[[], Any], retry_s: float = REPORT_RETRY_S) -> Any:
    """The request's answer, asked again for a while when the daemon does not answer (it
    may be restarting: the job is in its database, and it checks this process again)."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return request()
        except DaemonUnreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)


def cancel_quietly(client: Client, job_id: int) -> None:
    """Cancel a job this process queued (Ctrl-C while it waits); it may have just ended."""
    with contextlib.suppress(ConflictError, DaemonUnreachable):
        client.send(CancelRequest(id=job_id, withdrawn=True))
