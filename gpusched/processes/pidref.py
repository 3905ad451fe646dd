"""Process identity: a pid *and* its start time, the one way gpusched names a process.

A pid alone is not an identity: after a restart, a pid recorded in the database or in a
job directory may belong to an unrelated process by now (pids are reused). Two readings
of the same kernel fact are kept, for two kinds of reader:
- `process_start_time`: psutil's creation time as a string, stored in the database
  (`pid_start_time`) by the daemon, compared by `is_same_process`;
- `start_ticks`: field 22 of /proc/PID/stat, read without psutil by the zygote, whose
  fork path must stay light, and recorded in a job's `supervisor.json`.
They are not interchangeable (one is recorded by each side), which is why both live here
and nowhere else. psutil is imported only when called: the zygote imports this module.
"""

from __future__ import annotations


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat).

    None for a process that does not exist or is a zombie (it has ended).
    """
    fields = stat_fields(pid)
    if fields is None:
        return None
    state, ticks = fields[0], fields[19]
    return None if state in (b"Z", b"X") else int(ticks)


def stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (the state) on: [state, ppid, pgrp, ...]; None if gone.

    The command name (field 2) may hold spaces and parentheses, so the fields are split
    after its last ')'. Read without psutil: the zygote and the supervisor's kill loop
    call this and must stay light.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def is_same_ticks(pid: int, ticks: int | None) -> bool:
    """True if `pid` is alive and started at `ticks` (a `start_ticks` reading)."""
    return ticks is not None and start_ticks(pid) == ticks


def process_start_time(pid: int) -> str | None:
    """The process's creation time as stored in the database; None if it does not exist."""
    import psutil

    try:
        return repr(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):  # OSError: out of open files to read /proc with
        return None


def is_same_process(pid: int, start_time: str | None) -> bool:
    """True if `pid` is alive (not a zombie) and is the process that started at `start_time`."""
    import psutil

    if start_time is None:
        return False
    try:
        process = psutil.Process(pid)
        return (
            repr(process.create_time()) == start_time and process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def still_running(pid: int, start_time: str | None) -> bool:
    """For a polled job: is its process alive? True when that cannot be read right now
    (out of open files to read /proc with: ask again at the next poll)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return start_time in (None, "0") or repr(process.create_time()) == start_time
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True
