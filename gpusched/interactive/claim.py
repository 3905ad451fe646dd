"""`gpusched.claim()`: a GPU for this Python process (a notebook, a script started by hand).

    import gpusched
    gpu = gpusched.claim(mem="8G")   # first cell: blocks until placed
    import torch                     # sees only the claimed GPU

The process is the job: `claim()` queues it, waits for its placement, sets the
placement's variables in `os.environ` (CUDA reads them when it initialises, so this must
come before any framework touches the GPU), and returns a `Claim`. The GPU is held until
`release()`, the end of a `with` block, or the end of the process (reported at exit;
killed, the daemon notices within a poll and ends the job `lost`).

In a process that already runs in a gpusched job (a kernel from `gpusched kernel install`,
a `gpusched run` shell, a batch job), `claim()` returns that job's GPUs instead of
queueing another job (enclosing.py); its `release()` leaves them to that job.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from types import TracebackType

from gpusched.client import Client
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.interactive.cuda import cuda_already_loaded
from gpusched.interactive.enclosing import (
    ClaimInsideJob,
    check_fits,
    describe_holding,
    enclosing_job,
)
from gpusched.interactive.reservation import (
    REPORT_RETRY_S,
    NotPlaced,
    Placement,
    cancel_quietly,
    queue,
    report_end,
    wait_placed,
)

__all__ = ["Claim", "ClaimInsideJob", "CudaAlreadyInitialised", "NotPlaced", "claim"]


# The jobs claim() queued in this process and not yet released: their GPUSCHED_JOB_ID is in
# os.environ, but another claim() beside them wants GPUs of its own.
_CLAIMED_HERE: set[int] = set()


class CudaAlreadyInitialised(GpuschedError):
    """CUDA was loaded in this process before `claim()`: its GPUs are fixed already."""


class Claim:
    """GPUs held for this process. `.gpu_indices`, `.gpu_uuids`, `.job_id`, `.env`.

    `.inherited`: the GPUs are those of the job this process already ran in (claim()
    queued nothing); `release()` then changes nothing, as that job's end is its own.
    """

    def __init__(self, client: Client, placement: Placement, *, inherited: bool = False) -> None:
        self._client = client
        self.placement = placement
        self.job_id = placement.job_id
        self.gpu_indices = placement.gpu_indices
        self.gpu_uuids = placement.gpu_uuids
        self.released = False
        self.inherited = inherited
        if inherited:  # the job's own variables are in os.environ since the process began
            self.env: dict[str, str] = {}
            self._saved: dict[str, str | None] = {}
            return
        _CLAIMED_HERE.add(self.job_id)
        merged = placement.environment(dict(os.environ))
        self.env = {k: v for k, v in merged.items() if os.environ.get(k) != v}
        self._saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        atexit.register(self._at_exit)

    @property
    def job(self) -> Job:
        return self.placement.job

    def release(self, exit_code: int = 0, *, retry_s: float = REPORT_RETRY_S) -> None:
        """Give the GPUs back (the job ends `done`, or `failed` with a non-zero code).

        What the process still holds on the card counts as another process's from now.
        The variables claim() set are put back as they were.
        """
        if self.released:
            return
        self.released = True
        if self.inherited:
            return
        atexit.unregister(self._at_exit)
        _CLAIMED_HERE.discard(self.job_id)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        report_end(self._client, self.job_id, exit_code=exit_code, retry_s=retry_s)

    def _at_exit(self) -> None:
        # Exiting anyway: a daemon that does not answer at once sees us gone within a poll.
        with contextlib.suppress(GpuschedError):
            self.release(retry_s=0.0)

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release(0 if error is None else 1)

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        if self.inherited:
            state += " by the job this process runs in"
        gpus = ",".join(map(str, self.gpu_indices))
        return f"<gpusched.Claim job {self.job_id} GPU {gpus} ({state})>"


class _WaitingLine:
    """Says on stderr why the claim waits, each time the reason changes."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, job: Job) -> None:
        reason = job.waiting_reason or "queued"
        if reason != self.last:
            self.last = reason
            print(f"gpusched: job {job.id} waiting: {reason}", file=sys.stderr, flush=True)


def claim(
    mem: str | int | None = None,
    gpus: int = 1,
    timeout: float | None = None,
    *,
    time_limit: str | float | None = None,
    name: str | None = None,
    socket_path: str | None = None,
    ram: str | int | None = None,
    cpus: int | None = None,
) -> Claim:
    """Queue this process for `gpus` GPUs with `mem` each ("8G"; None: whole GPUs), block
    until placed (at most `timeout` seconds, then NotPlaced and the request is withdrawn),
    set CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER here, and return the Claim.

    `ram` ("24G") and `cpus`: this process's host memory and cores, as `run --ram
    --cpus`: once placed it is in cgroups of the job's own (what it allocated before
    stays counted where it was).

    While it waits it prints why to stderr (once, and again each time the reason changes:
    a notebook shows it under the cell); NotPlaced carries the last reason.

    In a process that already runs in a gpusched job (a kernel from `gpusched kernel
    install`), it says so on stderr and returns that job's GPUs (`.inherited`), or raises
    ClaimInsideJob if `gpus` or `mem` asks for more than that job holds.

    Raises CudaAlreadyInitialised if a framework has already initialised CUDA in this
    process: the variables would come too late. Ctrl-C (KeyboardInterrupt) while waiting
    withdraws the request. ProtocolError if the daemon's version is not this client's
    major.minor.
    """
    client = Client(socket_path)
    # Before the CUDA check: a job's variables were set before anything loaded CUDA. The
    # daemon is asked only where $GPUSCHED_JOB_ID is set (it refuses another version too).
    held = enclosing_job(client, _CLAIMED_HERE)
    if held is not None:
        check_fits(held, mem, gpus)
        print(
            f"gpusched: this process already runs in {describe_holding(held)}:"
            " claim() returns that job's GPUs instead of queueing another",
            file=sys.stderr,
            flush=True,
        )
        return Claim(client, Placement(held, {}), inherited=True)
    loaded = cuda_already_loaded()
    if loaded is not None:
        raise CudaAlreadyInitialised(
            f"CUDA is already initialised in this process ({loaded}): CUDA_VISIBLE_DEVICES"
            " would come too late. Call gpusched.claim() before any framework uses the GPU"
            " (in a notebook: restart the kernel and make it the first cell)"
        )
    client.check_version()  # a client installed in the user's env may differ from the server's
    command = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    job = queue(
        client,
        command,
        mem=mem,
        gpus=gpus,
        time_limit=time_limit,
        name=name,
        ram=ram,
        cpus=cpus,
    )
    try:
        placement = wait_placed(client, job.id, timeout_s=timeout, on_wait=_WaitingLine())
    except NotPlaced:
        cancel_quietly(client, job.id)
        raise
    except BaseException:  # KeyboardInterrupt while waiting: withdraw the request
        cancel_quietly(client, job.id)
        raise
    return Claim(client, placement)
