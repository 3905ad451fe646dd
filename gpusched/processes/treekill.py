"""Stopping a job's whole process tree, however fast it forks (used by the supervisor).

The supervisor is a child subreaper, so every descendant of the job is under it: an
orphan, even one that called setsid after a double fork, is re-parented to it, never
to init. Killing the tree is then a loop that ends when the supervisor has no
children left at all.

Why SIGSTOP first, not one SIGKILL per process listed: a process that forks in a loop
makes children faster than a listing can be signalled, so a kill pass always misses
the newest. A stopped process cannot fork (the kernel aborts a fork that a pending
signal interrupts), so the tree is frozen top-down, listed again until a pass finds no
process it had not stopped, and only then killed. Anything that still appears (a
process of the same user outside the job may SIGCONT one) is caught by the next round.
A cgroup freezer would do the same in one write, but needs cgroup v2 delegation that a
plain root daemon on a cgroup v1 machine does not have; this works everywhere.

Races: every signal goes through a pidfd opened on a pid read from its parent's
/proc/PID/task/*/children, and is sent only if that process's parent is still the one
it was listed under (or us). A pid cannot be reused while its parent has not reaped
it, our children's pids are reaped only by us, and a parent is stopped before its
children are listed; so a signal never reaches a process outside the job. ESRCH (gone
meanwhile) is the common, harmless case.

Stdlib (and pidref's /proc reader), psutil only on a kernel without
/proc/PID/task/TID/children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpusched.processes.pidref import stat_fields

_HAS_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
# A process in uninterruptible sleep (D state, e.g. stuck on NFS) dies only when its I/O
# returns: once only such processes are left, this long after SIGKILL, stop waiting.
UNKILLABLE_WAIT_S = 5.0


def children_of(pid: int) -> list[int]:
    """The direct children of `pid` (of all its threads); [] if it is gone."""
    if not _HAS_PROC_CHILDREN:
        return _children_by_psutil(pid)
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):  # a thread that just ended
            children += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return children


def _children_by_psutil(pid: int) -> list[int]:
    import psutil  # costs 10-30 ms to import: only here, never at the supervisor's start

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[1]), fields[0].decode())


def _open_child(pid: int, parent: int) -> int | None:
    """A pidfd on `pid` if it is still the child of `parent` (or ours), else None.

    The pidfd pins one process: checking its parent after opening it tells a process of
    the job from an unrelated one that got a reused pid.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    found = _parent_and_state(pid)
    if found is None or found[0] not in (parent, os.getpid()):
        os.close(pidfd)
        return None
    return pidfd


def _send(pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
        signal.pidfd_send_signal(pidfd, signum)


def terminate_tree() -> int:
    """SIGTERM every descendant once, top-down (the polite first step); how many."""
    me, sent = os.getpid(), 0
    frontier = [(me, child) for child in children_of(me)]
    while frontier:
        parent, pid = frontier.pop()
        with contextlib.suppress(OSError):  # EMFILE: whoever is missed gets SIGKILL later
            pidfd = _open_child(pid, parent)
            if pidfd is not None:
                _send(pidfd, signal.SIGTERM)
                os.close(pidfd)
                sent += 1
        frontier += [(pid, child) for child in children_of(pid)]
    return sent


def freeze_and_kill() -> int:
    """One round: SIGSTOP the tree top-down, listing again until a pass finds nobody
    new, then SIGKILL every process stopped; returns how many."""
    me = os.getpid()
    held: dict[int, int] = {}  # pid -> pidfd, kept open so the kill reaches the same process
    try:
        found_new = True
        while found_new:
            found_new = False
            frontier = [(me, child) for child in children_of(me)]
            while frontier:
                parent, pid = frontier.pop()
                if pid not in held:
                    try:
                        pidfd = _open_child(pid, parent)
                    except OSError:  # out of descriptors: kill what is held, next round
                        return len(held)
                    if pidfd is None:
                        continue
                    held[pid] = pidfd
                    _send(pidfd, signal.SIGSTOP)
                    found_new = True
                frontier += [(pid, child) for child in children_of(pid)]
        return len(held)
    finally:
        for pidfd in held.values():
            _send(pidfd, signal.SIGKILL)  # a stopped process receives SIGKILL at once
            os.close(pidfd)


def kill_tree(reap: Callable[[], None], pause: Callable[[float], None]) -> None:
    """Freeze and SIGKILL the whole tree, again and again, until we have no children.

    `reap` collects exited children, `pause(s)` waits up to s seconds (woken by SIGCHLD).
    Returns early only if every process left is in uninterruptible sleep (or a zombie
    whose parent is) UNKILLABLE_WAIT_S after the first kill, and says so on stderr.
    """
    _raise_open_files_limit()
    started = time.monotonic()
    me = os.getpid()
    while True:
        freeze_and_kill()
        reap()
        if not children_of(me):
            return
        pause(0.01)
        reap()
        if time.monotonic() - started >= UNKILLABLE_WAIT_S:
            left = _left_over()
            if left and all(state in ("D", "Z", "X") for state in left.values()):
                print(
                    f"gpusched supervisor: {len(left)} process(es) in uninterruptible sleep"
                    f" did not die ({_describe(left)}); leaving them to init",
                    file=sys.stderr,
                    flush=True,
                )
                return


def _raise_open_files_limit() -> None:
    """One pidfd per process is held while a tree is frozen: allow as many as we may."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _left_over() -> dict[int, str]:
    """The state letter of every descendant left."""
    left: dict[int, str] = {}
    frontier = children_of(os.getpid())
    while frontier:
        pid = frontier.pop()
        found = _parent_and_state(pid)
        if found is not None:
            left[pid] = found[1]
            frontier += children_of(pid)
    return left


def _describe(left: dict[int, str]) -> str:
    shown = sorted(left.items())[:10]
    more = f" and {len(left) - 10} more" if len(left) > 10 else ""
    return ", ".join(f"pid {pid} state {state}" for pid, state in shown) + more
