"""A job's environment: the submitter's, plus what gpusched sets for every job.

`CUDA_VISIBLE_DEVICES` (indices or UUIDs, ascending), `CUDA_DEVICE_ORDER`,
`GPUSCHED_JOB_ID`, `GPUSCHED_GPU_UUIDS`, a sweep's `GPUSCHED_ARRAY_ID` and
`GPUSCHED_ARRAY_INDEX`, identity variables from the account database when run as root
(never from the client), and the hints that keep frameworks within a shared card's share.
Used by the scheduler for jobs and by the hook runner for notification hooks.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence

from gpusched.core.models import Job


def job_environment(
    job: Job,
    submitted_env: dict[str, str],
    gpu_indices: Sequence[int],
    gpu_uuids: Sequence[str],
    visible_devices: str,
    *,
    gpu_totals: Sequence[int] = (),
) -> dict[str, str]:
    """The submitter's environment plus what gpusched sets for every job.

    `gpu_totals`: the total memory of the chosen GPUs, for `sharing_environment`.
    """
    env = dict(submitted_env)
    if os.geteuid() == 0:
        # Identity variables come from the account database, never from the client.
        try:
            entry = pwd.getpwuid(job.uid)
            env.update(
                HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name, SHELL=entry.pw_shell
            )
        except KeyError:
            pass
    env.update(gpu_environment(job.id, gpu_indices, gpu_uuids, visible_devices))
    env.update(sharing_environment(job.mem, gpu_totals, submitted_env))
    for name in ARRAY_VARIABLES:  # a sweep's jobs are told theirs; no other job inherits one
        env.pop(name, None)
    if job.array_id is not None:  # as Slurm's SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID
        env["GPUSCHED_ARRAY_ID"] = str(job.array_id)
        env["GPUSCHED_ARRAY_INDEX"] = str(job.array_index)
    return env


ARRAY_VARIABLES = ("GPUSCHED_ARRAY_ID", "GPUSCHED_ARRAY_INDEX")


def gpu_environment(
    job_id: int, gpu_indices: Sequence[int], gpu_uuids: Sequence[str], visible_devices: str
) -> dict[str, str]:
    """What every job is told of its GPUs (an interactive client sets it itself), in
    ascending index order: CUDA numbers them in the order given, and device 0 should be
    the lowest of them, as everywhere else (`--gpus 2` on GPUs 2 and 0 gives "0,2")."""
    if len(gpu_uuids) == len(gpu_indices):
        pairs = sorted(zip(gpu_indices, gpu_uuids, strict=True))
        gpu_indices, gpu_uuids = [i for i, _ in pairs], [u for _, u in pairs]
    else:
        gpu_indices = sorted(gpu_indices)
    visible = gpu_uuids if visible_devices == "uuid" else [str(i) for i in gpu_indices]
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSCHED_JOB_ID": str(job_id),
        "GPUSCHED_GPU_UUIDS": ",".join(gpu_uuids),
    }


def sharing_environment(
    mem: int | None, gpu_totals: Sequence[int], submitted_env: dict[str, str]
) -> dict[str, str]:
    """Tell frameworks that grab a whole card by default to take only the job's share.

    Only for a job with a declared size (it shares the card), and never over a value the
    submitter set. JAX preallocates 75 % of the card: XLA_PYTHON_CLIENT_MEM_FRACTION is
    declared / total, rounded *down* to two decimals so the preallocation stays within the
    declared size (on a multi-GPU job, of the smallest card). TensorFlow maps every card
    whole: TF_FORCE_GPU_ALLOW_GROWTH makes it allocate as it goes.
    """
    if mem is None:
        return {}
    extra = {}
    if gpu_totals and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in submitted_env:
        hundredths = max(1, min(100, mem * 100 // min(gpu_totals)))
        extra["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{hundredths / 100:.2f}"
    if "TF_FORCE_GPU_ALLOW_GROWTH" not in submitted_env:
        extra["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return extra
