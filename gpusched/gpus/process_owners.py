"""Who holds GPU memory outside gpusched: each such process's owner, program and pid, as
gpustat shows them (`bob:python3/4242(10.0G)`), read from /proc for the few processes
NVML lists, never by scanning every process.

A process is a job's when a running job's process is among its ancestors (a job's
children and grandchildren are the job's); the walk up is bounded and stops at pid 1.
"""

from __future__ import annotations

import pwd
from collections.abc import Collection, Sequence
from pathlib import Path

from gpusched.core.models import GpuProcess

PROC = Path("/proc")
MAX_DEPTH = 64  # ancestors looked at: deeper trees than this are not a job's


def parent_of(pid: int) -> int | None:
    """The parent pid from /proc/PID/stat; None when the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "PID (comm) STATE PPID ...": comm may hold spaces and parentheses; cut at the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def under_any(pid: int, roots: Collection[int]) -> bool:
    """Whether `pid` is one of `roots` or a descendant of one."""
    current: int | None = pid
    for _ in range(MAX_DEPTH):
        if current is None or current <= 1:
            return False
        if current in roots:
            return True
        current = parent_of(current)
    return False


def describe(process: GpuProcess) -> dict[str, object]:
    """{"pid", "user", "command", "used"}: the owner's name (or uid), the program's name
    (/proc/PID/comm, at most 15 characters: no arguments, which may be private)."""
    user: str | None = None
    command: str | None = None
    try:
        uid = (PROC / str(process.pid)).stat().st_uid
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        command = (PROC / str(process.pid) / "comm").read_text().strip() or None
    except OSError:  # gone, or in another pid namespace (a container's)
        pass
    return {"pid": process.pid, "user": user, "command": command, "used": process.used_bytes}


def outside_processes(
    processes: Sequence[GpuProcess],
    job_pids: Collection[int],
    theirs: Collection[int] = (),
    seen: Collection[int] = (),
) -> list[dict[str, object]]:
    """The processes of one GPU that no running job started, described, largest first
    (`theirs`: pids known to be a job's, though their /proc entry may have gone since).

    `seen`: pids whose /proc entry was there when `processes` was read. Such a pid with
    none now has exited since, and holds nothing: it is left out, not shown as "?". A
    pid never seen there is another pid namespace's (a container's): "?" is all we know.
    """
    roots, known = set(job_pids), set(theirs)
    outside = [p for p in processes if p.pid not in known and not under_any(p.pid, roots)]
    outside = [p for p in outside if p.pid not in seen or (PROC / str(p.pid)).exists()]
    outside.sort(key=lambda p: -(p.used_bytes or 0))
    return [describe(p) for p in outside]
