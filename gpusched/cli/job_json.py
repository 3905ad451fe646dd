"""A job as the JSON contract's JOB object, drawn from a reply without the models'
dataclasses (core/models.py `Job`): `job_json(data)` is what `Job.from_json(data).to_json()`
gives (Job's fields only, in its order, its defaults for what the reply leaves out).

For `gpusched show` and `submit`, which print a job and start without creating the
models' dataclasses, so that they answer at interpreter speed; tests/test_cli_fast.py keeps
JOB_REQUIRED and JOB_DEFAULTS equal to Job's fields and job_json to Job's round trip.
"""

from __future__ import annotations

from gpusched.core.errors import ProtocolError

TYPE_CHECKING = False  # typing's own import costs every `gpusched show`
if TYPE_CHECKING:
    from typing import Any

# Job's fields without a default, then those with one, each in Job's order (no field
# without a default follows one with a default there).
JOB_REQUIRED = ("id", "user", "uid", "command", "cwd")
JOB_DEFAULTS: dict[str, Any] = {
    "state": "queued",
    "name": None,
    "mem": None,
    "gpus": 1,
    "ram": None,
    "cpus": None,
    "gpu_indices": [],
    "gpu_uuids": [],
    "priority": 0,
    "after": [],
    "after_when": None,
    "submitted_at": None,
    "started_at": None,
    "ended_at": None,
    "run_s": None,
    "host_peak": None,
    "cpu_s": None,
    "pid": None,
    "exit_code": None,
    "reason": None,
    "reason_detail": None,
    "waiting_reason": None,
    "log_path": None,
    "log_removed": None,
    "peak_mem": None,
    "mean_util": None,
    "hints": [],
    "util_min": None,
    "util_max": None,
    "util_stddev": None,
    "overrun_at": None,
    "retry_oom": None,
    "retry_of": None,
    "retried_as": None,
    "array_id": None,
    "array_index": None,
    "max_concurrent": None,
    "time_limit_s": None,
    "notify": None,
    "notify_result": None,
    "output": None,
    "node": None,
    "allowed_nodes": None,
    "requeue": None,
    "interactive": False,
    "warning": None,
    "exclusive": False,
    "share": False,
    "top": None,
    "demand": None,
    "shared_with": None,
    "sharing_speed": None,
    "mem_used": None,
    "attempts": None,
    "cut": False,
}


def job_json(data: dict[str, Any]) -> dict[str, Any]:
    """The JOB object of a reply's job: Job's fields in order, a list copied, the state a
    string ("queued" when absent)."""
    job: dict[str, Any] = {}
    for name in JOB_REQUIRED:
        if name not in data:
            raise ProtocolError(f"the daemon sent a job without {name!r}")
        job[name] = data[name]
    for name, default in JOB_DEFAULTS.items():
        value = data.get(name, default)
        job[name] = list(value) if isinstance(value, list) else value
    job["state"] = str(job["state"])
    if not job["cut"]:  # as Job.to_json: only where true
        del job["cut"]
    return job
