"""The gpusched job this process already runs in, for `claim()`: a kernel started by
`gpusched kernel install`'s spec, a shell of `gpusched run`, a batch job's script.

Such a process has its GPUs already (CUDA_VISIBLE_DEVICES was set when it started, and
the daemon holds them while the job lives), so `claim()` there hands over that job
instead of queueing a second reservation for the same process: one that would hold
another card, or wait forever behind the job's own. The job is found by the
GPUSCHED_JOB_ID every job is started with, and believed only if the daemon says that job
is running and is this user's (a variable inherited from a job that has ended is not), and
only if it is not one this process claimed itself (its variables are in os.environ too).
"""

from __future__ import annotations

import os
from collections.abc import Collection

from gpusched.client import Client
from gpusched.core.errors import GpuschedError, NotFoundError, PermissionDenied
from gpusched.core.models import Job, JobState
from gpusched.core.units import format_size, parse_job_mem

JOB_ID_ENV = "GPUSCHED_JOB_ID"


class ClaimInsideJob(GpuschedError):
    """`claim()` in a process that already runs in a gpusched job asked for more GPUs or
    memory than that job holds: a second reservation would not reach this process."""


def enclosing_job(client: Client, own: Collection[int]) -> Job | None:
    """The running job of this user named by $GPUSCHED_JOB_ID, or None.

    `own`: the jobs this process's earlier claims queued, whose variables claim() set in
    os.environ itself; a second claim beside them is a claim of its own.
    """
    raw = os.environ.get(JOB_ID_ENV, "")
    if not raw.isdigit() or int(raw) in own:
        return None
    try:
        job = client.job(int(raw))
    except (NotFoundError, PermissionDenied):
        return None
    if job.state != JobState.RUNNING or job.uid != os.getuid():
        return None
    return job


def describe_holding(job: Job) -> str:
    """Says, for example, "job 12 (kernel gpusched-8g), which holds GPU 1 with 8G"."""
    name = f" ({job.name})" if job.name else ""
    cards = "GPU" if len(job.gpu_indices) == 1 else "GPUs"
    where = ",".join(map(str, sorted(job.gpu_indices)))
    size = "whole" if job.mem is None else f"with {format_size(job.mem, tabular=False)}"
    return f"job {job.id}{name}, which holds {cards} {where} {size}"


def check_fits(job: Job, mem: str | int | None, gpus: int) -> None:
    """Refuse a claim the enclosing job cannot give. `mem=None` names no size: the job's
    share is what this process has, and the caller is told so rather than refused."""
    wanted = None if mem is None else parse_job_mem(mem, what="mem")
    too_much = wanted is not None and job.mem is not None and wanted > job.mem
    if gpus <= job.gpus and not too_much:
        return
    asked = f"{gpus} GPU{'s' if gpus > 1 else ''}"
    if wanted is not None:
        asked += f" with {format_size(wanted, tabular=False)}"
    raise ClaimInsideJob(
        f"this process already runs in {describe_holding(job)}; claim() asks for {asked},"
        " which a second job would hold for another process. Start the notebook or"
        " script with that much instead (gpusched kernel install --mem SIZE --gpus N,"
        " or gpusched run/submit --mem SIZE --gpus N)"
    )
