"""The array cap: a sweep's `--max-concurrent`, how many of its jobs run at once.

A job whose array already runs that many waits with a reason and claims no card. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.scheduling.policy.data import WaitingJob


def array_cap_reason(job: WaitingJob, array_running: Mapping[int, int]) -> str | None:
    """Why `job` waits for its array's `--max-concurrent`; None: it does not."""
    if job.array_cap is None or job.array_id is None:
        return None
    in_array = array_running.get(job.array_id, 0)
    if in_array < job.array_cap:
        return None
    return (
        f"array limit: {in_array} of array a{job.array_id} running"
        f" (--max-concurrent {job.array_cap})"
    )
