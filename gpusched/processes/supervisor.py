"""The job supervisor: one small process per job, between the daemon and the job.

The daemon starts `python -m gpusched.processes.supervisor SPEC` in a new session. The
supervisor becomes a child subreaper (so every descendant of the job, even one that
calls setsid and whose parent exits, is re-parented to it and can be found and
killed), opens the job's log, starts the job as its owner, waits for it and writes
how it ended to `exit.json` next to the spec. Because the outcome is on disk, a
daemon that was killed or restarted meanwhile still learns the real exit code. The
daemon reserved that record's space when it wrote the spec (gpusched.processes.durable):
a disk filled while the job ran does not keep its end from being written.

The exit record also says how long the job ran (`run_s`), measured on CLOCK_MONOTONIC
from its start to its main process's end: a jump of the wall clock meanwhile (NTP, a
manual date) does not change it, as it changes ended_at - started_at.

SIGTERM (sent by the daemon on cancel) means: SIGTERM the job's whole tree, wait
the grace period, then freeze and SIGKILL whatever is left, again and again until the
supervisor has no child at all (gpusched.processes.treekill: a job that forks continuously cannot
outrun it). When the job's main process exits, any process it left behind is stopped
the same way, so nothing keeps GPU memory after its job has ended. `exit.json` is
written only then: a job recorded as ended has no process left.

With `exec_by` in the spec (a cluster node's launch deadline, on CLOCK_MONOTONIC, which
the daemon's clock shares), the supervisor refuses to start the command past it and
records a transient failure to start: the job goes back to the queue, never run.

With `max_log_bytes` in the spec, the supervisor keeps the log under that size by
cutting its middle (gpusched.processes.logcap), checked every time its loop wakes: at least once
a second, ten times a second while the log grows fast.

Stdlib only (psutil only on a kernel without /proc/PID/task/TID/children, and only
when a tree must be stopped): this runs once per job and its start-up is part of every
job's dispatch time.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.core.units import format_duration, format_size
from gpusched.processes import cgroups, cpusets, devices, shm, treekill
from gpusched.processes.credentials import (
    DirectoryRefused,
    in_owners_directory,
    owner_credentials,
)
from gpusched.processes.durable import NO_SPACE_ERRNOS, write_record
from gpusched.processes.logcap import cap_log
from gpusched.processes.user_log import open_user_log

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _open_log(path: str, uid: int, gid: int) -> int:
    """Create the job's log afresh, owned by the job's owner, mode 0600.

    O_EXCL|O_NOFOLLOW: a symlink or file planted at that name is never followed or
    reused; it is removed and the log created anew. Opened as root, which is safe only
    because nothing in the path is the user's: `log_dir` is the daemon's and the name is
    the job's id (the job's own cwd and command are touched only after the drop).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_APPEND
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, flags, 0o600)
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    return fd


def _has_children() -> bool:
    """Whether any process is left under us (as a subreaper, any descendant left implies
    a direct child of ours: orphans are re-parented to us)."""
    return bool(treekill.children_of(os.getpid()))


class Supervisor:
    def __init__(self, spec: dict[str, Any], exit_path: Path) -> None:
        self.spec = spec
        self.exit_path = exit_path
        self.terminate_requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self.log_cap = spec.get("max_log_bytes") or None
        self._cap_fd = -1  # the log, read-write without O_APPEND, to cut it (logcap)
        self._log_size = 0
        self._cap_failed = False
        cgroup = spec.get("cgroup")
        # The job's own memory cgroup (gpusched.processes.cgroups), when the daemon has one.
        self.cgroup = (
            cgroups.MemoryCgroup(Path(cgroup["path"]), int(cgroup["version"])) if cgroup else None
        )
        self.host_mem_limit: int | None = cgroup.get("limit") if cgroup else None
        # Its own cores (gpusched.processes.cpusets), made by the daemon: on cgroup v1 a
        # hierarchy apart, joined around the fork; on v2 its memory cgroup's directory.
        cpuset = spec.get("cpuset")
        self._v1_cpuset = Path(cpuset["path"]) if cpuset and int(cpuset["version"]) == 1 else None
        fence = spec.get("devices")  # its devices cgroup and the other cards' nodes to deny
        self.devices = Path(fence["path"]) if fence else None
        self._devices_version: int = int(fence.get("version", 1)) if fence else 1
        self._deny: list[str] = fence["deny"] if fence else []
        self._shm = False
        self._run_s: float | None = None  # how long the job ran, once it has ended
        # What it used of the host, once it has ended: the most memory its cgroup held at
        # once, the CPU time of all its processes.
        self._used: dict[str, float | int] = {}

    def _on_term(self, _signum: int, _frame: object) -> None:
        self.terminate_requested = True

    def _record(self, **outcome: Any) -> None:
        outcome.setdefault("ended_at", time.time())
        if self._run_s is not None:
            outcome["run_s"] = self._run_s
        outcome.update(self._used)
        write_record(self.exit_path, outcome)

    def _start(self, log_fd: int) -> subprocess.Popen[bytes]:
        spec = self.spec
        uid, gid, groups = spec["uid"], spec["gid"], spec["groups"]
        # The job inherits its directory, entered with its owner's rights (a user's
        # symlink is never followed as root); the exec happens after the drop to the owner.
        with in_owners_directory(spec["cwd"], uid, gid, groups):
            return subprocess.Popen(
                spec["argv"],
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                umask=spec["umask"],
                start_new_session=True,
                close_fds=True,
                **owner_credentials(uid, gid, groups),
            )

    def _stop_tree(self, grace_s: float, wakeup_fd: int) -> None:
        """SIGTERM every descendant, wait up to the grace period, then freeze and SIGKILL
        the tree until we have no child left (see gpusched.processes.treekill)."""

        def pause(seconds: float) -> None:
            select.select([wakeup_fd], [], [], seconds)
            _drain(wakeup_fd)
            self._check_log()

        treekill.terminate_tree()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._reap()
            if not _has_children():
                return
            pause(0.05)
        treekill.kill_tree(self._reap, pause)
        self._reap()

    def _job_pids(self) -> list[int]:
        """The job's processes: its cgroup's, or without one the supervisor's descendants."""
        if self.cgroup is not None:
            return self.cgroup.procs()
        found: list[int] = []
        todo = [os.getpid()]
        while todo:
            kids = treekill.children_of(todo.pop())
            found += kids
            todo += kids
        return found

    def _prepare_job_sandbox(self) -> None:
        """As root, before the job starts: its cgroup and its private /dev/shm."""
        if self.cgroup is not None:
            try:
                self.cgroup.path.mkdir(exist_ok=True)
            except OSError as exc:
                print(f"gpusched supervisor: no cgroup for the job: {exc}", file=sys.stderr)
                self.cgroup = None
        if self.cgroup is not None and self.host_mem_limit is not None:
            try:
                self.cgroup.set_limit(self.host_mem_limit)
            except OSError as exc:
                print(f"gpusched supervisor: job's memory uncapped: {exc}", file=sys.stderr)
                self.host_mem_limit = None
        if self.spec.get("private_shm"):
            try:
                shm.private_shm()
                self._shm = True
            except OSError as exc:
                print(f"gpusched supervisor: shared /dev/shm: {exc}", file=sys.stderr)

    def _release_job_sandbox(self) -> HostMemory:
        """Once no process of the job is left: free its /dev/shm and SysV segments, read
        what its cgroup counted, remove the cgroup."""
        if self._shm:
            shm.release_shm()
            self._shm = False
        if self._v1_cpuset is not None:
            cpusets.remove_job_cpuset(self._v1_cpuset)
        used = HostMemory()
        if self.cgroup is not None:
            used = HostMemory(
                self.cgroup.oom_kills(),
                self.host_mem_limit is not None and self.cgroup.reached_limit(),
                self.cgroup.peak(),
            )
        # On cgroup v2 the devices cgroup is this same directory: removed after the read.
        if self.devices is not None:
            devices.remove_job_cgroup(self.devices)
        if self.cgroup is not None:
            cgroups.remove_job_cgroup(self.cgroup)
        return used

    def _host_oom_message(self, used: HostMemory) -> str:
        killed = f"the kernel's OOM killer stopped {used.oom_kills} of its processes"
        if used.reached_limit and self.host_mem_limit is not None:
            size = format_size(self.host_mem_limit, tabular=False)
            return f"killed for host memory: {killed} at its own host memory limit of {size}"
        return f"killed for host memory: {killed} (the service's memory limit was reached)"

    def _check_log(self) -> float:
        """Keep the log under its cap; returns how long the loop may sleep before the
        next check (shorter while the log grows fast)."""
        if self.log_cap is None or self._cap_fd < 0:
            return 1.0
        try:
            cut = cap_log(self._cap_fd, self.log_cap)
            size = os.fstat(self._cap_fd).st_size
        except OSError as exc:  # e.g. a full disk: the job goes on, uncapped for now
            if not self._cap_failed:  # once, not every second
                print(f"gpusched supervisor: cannot cap the log: {exc}", file=sys.stderr)
                self._cap_failed = True
            return 1.0
        grew, self._log_size = size - self._log_size, size
        return 0.1 if cut or grew > self.log_cap // 16 else 1.0

    def _reap(self) -> None:
        """Reap every exited child (the job and orphans re-parented to us)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child is not None and pid == self.child.pid:
                self.child.returncode = os.waitstatus_to_exitcode(status)

    def run(self) -> int:
        spec = self.spec
        _become_subreaper()
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(write_fd)
        # Handlers only set flags; the loop below acts (handlers are reset in the job on exec).
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        try:
            if spec.get("log_as_owner"):  # `--output`: a path of the user's choosing
                log_fd = open_user_log(
                    spec["log_path"], spec["uid"], spec["gid"], spec["groups"], spec["umask"]
                )
            else:
                log_fd = _open_log(spec["log_path"], spec["uid"], spec["gid"])
        except OSError as exc:
            self._record(
                outcome="failed_to_start",
                message=f"cannot open log {spec['log_path']}: {exc.strerror}",
                # A full disk passes: the command never ran, so the job may wait its turn.
                transient=exc.errno in NO_SPACE_ERRNOS,
            )
            return 1
        if self.log_cap is not None:
            # A second open file of the same log (through /proc, not its name): ours
            # without O_APPEND, since pwrite on an O_APPEND descriptor always appends.
            try:
                self._cap_fd = os.open(f"/proc/self/fd/{log_fd}", os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                print(f"gpusched supervisor: log not capped: {exc}", file=sys.stderr, flush=True)
        self._prepare_job_sandbox()
        exec_by = spec.get("exec_by")
        if exec_by is not None and time.monotonic() >= float(exec_by):
            # A cluster node's lease ran out before the launch: the cluster may already
            # have given the job to another node. The command never ran: transient, so
            # the job goes back to the queue.
            os.close(log_fd)
            self._release_job_sandbox()
            self._record(
                outcome="failed_to_start",
                message="not started: this node's lease ran out before the launch",
                transient=True,
            )
            return 1
        try:
            if self.devices is not None:  # never started with every card open (FenceError)
                devices.make_job_cgroup(self.devices, self._deny, self._devices_version)
            # Devices first: on cgroup v2 both are one directory, and the way back is the
            # one read before the first move.
            with (
                devices.job_fork(self.devices, self._devices_version),
                cgroups.job_fork(self.cgroup),
                cpusets.joined(self._v1_cpuset),
            ):
                self.child = self._start(log_fd)
            cgroups.raise_job_scores(self._job_pids)
        except (OSError, subprocess.SubprocessError, ValueError, DirectoryRefused) as exc:
            message = _start_error(exc, spec)
            os.write(log_fd, f"gpusched: {message}\n".encode())
            # Out of tasks or memory (another job filled the service's limits): the command
            # never ran, so the daemon may queue the job again instead of failing it.
            transient = isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.ENOMEM)
            self._release_job_sandbox()
            self._record(outcome="failed_to_start", message=message, transient=transient)
            return 1
        finally:
            os.close(log_fd)
        return self._supervise(self.child, read_fd)

    def _supervise(self, child: subprocess.Popen[bytes], read_fd: int) -> int:
        spec = self.spec
        cancelled = timed_out = False
        started = time.monotonic()  # its run time is measured here: a wall-clock jump
        limit = spec.get("time_limit_s")
        limit_s = None if limit is None else float(limit)
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while child.returncode is None:
            if self.terminate_requested and not cancelled:
                cancelled = True
                self._stop_tree(float(spec["kill_grace_s"]), read_fd)
                continue
            # The time limit is kept here, not by the daemon, so it holds across daemon restarts.
            if deadline is not None and not timed_out and time.monotonic() >= deadline:
                timed_out = True
                self._stop_tree(float(spec["kill_grace_s"]), read_fd)
                continue
            wait_s = self._check_log()
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            select.select([read_fd], [], [], wait_s)
            _drain(read_fd)
            self._reap()
        self._run_s = round(time.monotonic() - started, 3)  # until its main process ended
        # The main process is gone; stop anything it left behind holding the GPU.
        if _has_children():
            self._stop_tree(float(spec["kill_grace_s"]), read_fd)
        self._check_log()  # nothing writes any more: the final log is within the cap
        code = child.returncode
        used = self._release_job_sandbox()
        self._used = _host_used(used)
        if used.oom_kills and not (cancelled or self.terminate_requested) and code != 0:
            # The kernel killed some of the job's processes for the service's memory (the
            # host's, not the GPU's): an end of its own, never retried (--retry-oom is for
            # GPU memory, which a bigger --mem fixes; this is not).
            self._record(
                outcome="host_oom",
                exit_code=_exit_code(code),
                signal=_signal_of(code),
                message=self._host_oom_message(used),
            )
        elif timed_out and not cancelled:
            self._record(
                outcome="timeout",
                exit_code=_exit_code(code),
                signal=_signal_of(code),
                message="ran longer than its time limit of "
                + format_duration(limit_s or 0.0, exact=True),
            )
        elif cancelled or self.terminate_requested:
            self._record(outcome="cancelled", exit_code=_exit_code(code), signal=_signal_of(code))
        elif code < 0:
            self._record(
                outcome="signal",
                exit_code=_exit_code(code),
                signal=-code,
                message=f"killed by {signal.Signals(-code).name}",
            )
        else:
            self._record(outcome="exit", exit_code=code)
        return 0


@dataclass(frozen=True)
class HostMemory:
    """What a job's cgroup counted by its end."""

    oom_kills: int = 0  # its processes the kernel's OOM killer stopped
    reached_limit: bool = False  # its own cap (not the service's) was reached
    peak_bytes: int | None = None


def _host_used(used: HostMemory) -> dict[str, float | int]:
    """The exit record's `host_peak` (bytes, where the job had a memory cgroup) and
    `cpu_s`: the CPU time (user and system) of every process of the job, all reaped by
    now (the supervisor is their subreaper, so orphans count too)."""
    times = resource.getrusage(resource.RUSAGE_CHILDREN)
    found: dict[str, float | int] = {"cpu_s": round(times.ru_utime + times.ru_stime, 3)}
    if used.peak_bytes is not None:
        found["host_peak"] = used.peak_bytes
    return found


def _exit_code(code: int) -> int:
    # A shell reports death by signal N as 128+N; so do we.
    return 128 - code if code < 0 else code


def _signal_of(code: int) -> int | None:
    return -code if code < 0 else None


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def _start_error(exc: BaseException, spec: dict[str, Any]) -> str:
    argv0 = spec["argv"][0]
    if isinstance(exc, DirectoryRefused):
        # Entered as the owner; one message whatever the reason, and nothing checked here
        # as root, so a failure tells the owner no more about a path than their own `cd`.
        return f"working directory {spec['cwd']} does not exist or you cannot enter it"
    if isinstance(exc, devices.FenceError):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {argv0}"
    if isinstance(exc, PermissionError):
        return f"cannot execute {argv0}: permission denied"
    if isinstance(exc, OSError) and exc.errno == errno.ENOEXEC:
        return f"cannot execute {argv0}: not an executable file"
    return f"could not start {argv0}: {exc}"


def read_spec(spec_path: Path) -> dict[str, Any]:
    """Read a job's spec and delete it: it holds the job's whole environment (tokens,
    keys), and a sweep of 10,000 jobs would otherwise leave 10,000 copies on disk."""
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    with contextlib.suppress(OSError):
        spec_path.unlink()
    return spec


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpusched.processes.supervisor SPEC.json", file=sys.stderr)
        return 2
    spec_path = Path(argv[1])
    spec = read_spec(spec_path)
    return Supervisor(spec, spec_path.with_name("exit.json")).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
