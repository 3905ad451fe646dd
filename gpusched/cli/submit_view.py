"""`gpusched submit`: its options as `Client.submit` takes them, and what it prints, shared by
the click command (cli/submit.py) and the fast path (cli/fast.py), so both check the same
values with the same words and print the same. Imports neither click, the client nor the
models (the job printed is the reply's JSON, cli/job_json.py).
"""

from __future__ import annotations

import json

from gpusched.core.units import parse_job_mem, parse_job_ram, parse_job_time

TYPE_CHECKING = False  # typing's own import costs every `gpusched submit`
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any


def job_options(
    *,
    mem: str | None = None,
    gpus: int = 1,
    name: str | None = None,
    priority: int = 0,
    after: str | None = None,
    hold: bool = False,
    cwd: str | None = None,
    time_limit: str | None = None,
    notify: str | None = None,
    retry_oom: int = 0,
    nodes: str | None = None,
    requeue: bool = False,
    exclusive: bool = False,
    share: bool = False,
    output: str | None = None,
    ram: str | None = None,
    cpus: int | None = None,
    array_jobs: Callable[[int], Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The command line's values checked and converted (UsageError in the user's words).
    `array_jobs`: an array's job ids (the daemon's answer), for `--after aN`."""
    parsed_after, after_when = dependencies(after, array_jobs) if after else ((), None)
    return {
        "mem": None if mem is None else "auto" if mem == "auto" else parse_job_mem(mem),
        "gpus": gpus,
        "name": name,
        "priority": priority,
        "after": parsed_after,
        "after_when": after_when,
        "hold": hold,
        "cwd": cwd,
        "time_limit": parse_job_time(time_limit) if time_limit is not None else None,
        "notify": notify,
        "retry_oom": retry_oom,
        "nodes": None if nodes is None else tuple(n.strip() for n in nodes.split(",")),
        "requeue": requeue,
        "exclusive": exclusive,
        "share": share,
        "output": output,
        "ram": None if ram is None else parse_job_ram(ram),
        "cpus": cpus,
    }


def dependencies(
    after: str, array_jobs: Callable[[int], Sequence[int]] | None
) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """`--after`'s ids and their conditions (None: all `ok`), each array id replaced by
    its jobs' ids with its condition: every job of the array must end so."""
    from gpusched.core.after import AFTER_FAILED, AFTER_OK, parse_after
    from gpusched.core.errors import UsageError

    ids: list[int] = []
    conditions: list[str] = []
    for is_array, number, when in parse_after(after):
        if not is_array:
            ids.append(number)
            conditions.append(when)
            continue
        if when == AFTER_FAILED:
            # Each of its jobs fails or not on its own: which would "the array failed" be?
            raise UsageError(
                f"--after a{number}:failed: an array does not fail as one; give a{number}"
                f" or a{number}:any, or the ids of the jobs whose failure you wait for"
            )
        if array_jobs is None:
            raise UsageError(f"--after a{number}: arrays are not taken here")
        members = list(array_jobs(number))
        ids.extend(members)
        conditions.extend([when] * len(members))
    return tuple(ids), None if all(w == AFTER_OK for w in conditions) else tuple(conditions)


def submitted_text(job: dict[str, Any], as_json: bool) -> str:
    """The new job's id, or with --json the job (`job`: the daemon's reply, or a
    `Job.to_json()`: the same JOB object either way)."""
    if not as_json:
        return str(job["id"])
    from gpusched.cli.job_json import job_json

    return json.dumps(job_json(job), indent=2, sort_keys=False)
