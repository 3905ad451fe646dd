"""Which GPU processes belong to which job: each job's whole process tree; and the
processes on each GPU that gpusched did not start (`outsiders`).

NVML lists the pids holding memory on a GPU; a job is its supervisor and every
descendant (children included, and orphans, which the supervisor reaps as a subreaper).
One scan of the process table per tick serves every job (`process_children`), made by
the pass outside the scheduler's lock: on a busy host it is the pass's longest step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from gpusched.core.models import GpuProcess, GpuState, Job

ProcessChildren = Mapping[int, list[int]]  # pid -> its children's pids


def process_children() -> dict[int, list[int]]:
    """Every process on the host, as each parent's children: one walk of the table."""
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"] or 0, []).append(process.pid)
    return children


def _tree(root: int, children: ProcessChildren) -> set[int]:
    seen = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def attribute_processes(
    gpus: Iterable[GpuState], running: Iterable[Job], children: ProcessChildren | None = None
) -> dict[int, dict[str, list[GpuProcess]]]:
    """Each running job's processes holding memory on each GPU: those of its whole tree.

    One scan of the process table per tick, not one per job: `children`, from
    `process_children`, walked now if not given.
    """
    gpus = list(gpus)
    found: dict[int, dict[str, list[GpuProcess]]] = {}
    if not any(gpu.processes for gpu in gpus):
        return found
    if children is None:
        children = process_children()
    for job in running:
        if job.pid is None:
            continue
        tree = _tree(job.pid, children)
        for gpu in gpus:
            mine = [p for p in gpu.processes if p.pid in tree]
            if sum(p.used_bytes or 0 for p in mine):
                found.setdefault(job.id, {})[gpu.uuid] = mine
    return found


def held_bytes(processes: dict[int, dict[str, list[GpuProcess]]]) -> dict[int, dict[str, int]]:
    """GPU memory per running job and GPU, from `attribute_processes`."""
    return {
        job_id: {uuid: sum(p.used_bytes or 0 for p in procs) for uuid, procs in per_gpu.items()}
        for job_id, per_gpu in processes.items()
    }


@dataclass(frozen=True)
class Outsider:
    """The largest process on a GPU that gpusched did not start: its pid and owner (never
    its command line: another user's arguments are theirs), and what such processes hold."""

    pid: int
    uid: int | None  # None: it could not be read (it ended, or another namespace's)
    user: str | None
    used_bytes: int  # that process's
    all_bytes: int  # every process there gpusched did not start


def jobs_pids(
    processes: Mapping[int, Mapping[str, Sequence[GpuProcess]]],
) -> dict[str, frozenset[int]]:
    """Per GPU uuid, the pids there that are a running job's (`attribute_processes`)."""
    ours: dict[str, set[int]] = {}
    for per_gpu in processes.values():
        for uuid, procs in per_gpu.items():
            ours.setdefault(uuid, set()).update(p.pid for p in procs)
    return {uuid: frozenset(pids) for uuid, pids in ours.items()}


def outsiders(
    gpus: Iterable[GpuState], processes: Mapping[int, Mapping[str, Sequence[GpuProcess]]]
) -> dict[str, Outsider]:
    """Per GPU uuid, the largest process holding memory there that is no running job's
    (`processes`: `attribute_processes`); GPUs with none are left out."""
    ours = jobs_pids(processes)
    found: dict[str, Outsider] = {}
    for gpu in gpus:
        mine = ours.get(gpu.uuid, frozenset())
        others = [p for p in gpu.processes if (p.used_bytes or 0) > 0 and p.pid not in mine]
        if not others:
            continue
        largest = max(others, key=lambda p: (p.used_bytes or 0, -p.pid))
        uid, user = _owner(largest.pid)
        found[gpu.uuid] = Outsider(
            largest.pid,
            uid,
            user,
            largest.used_bytes or 0,
            sum(p.used_bytes or 0 for p in others),
        )
    return found


def _owner(pid: int) -> tuple[int | None, str | None]:
    try:
        process = psutil.Process(pid)
        uid = process.uids().real
    except psutil.Error:
        return None, None
    try:
        return uid, process.username()
    except (psutil.Error, KeyError):
        return uid, None  # a uid with no name here
