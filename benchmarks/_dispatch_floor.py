"""The durable floor under dispatch: each step a job's start and end must take, timed alone.

What a queue with gpusched's guarantees must do per job, and nothing else, measured with
no scheduler, no supervisor process of Python's size and no SQLAlchemy around it, each
step named and timed by itself (medians), in the order a job meets them:

- its start committed (SQLite WAL, synchronous=FULL), before it may run, so a crash never
  runs it twice (issue 5);
- its spec written where its supervisor reads it (a private job directory, renamed into
  place, not fsynced: it must outlive the daemon, not a power cut);
- the supervisor's identity recorded next to it and read back (what tells a restarted
  daemon whether the job started: gpusched.processes.zygote);
- the spec read and deleted (it holds the job's environment: no copy stays on disk);
- the job's log created afresh, owned by its owner;
- the job's oom_score_adj set around its fork and the supervisor's restored (as root);
- its memory cgroup made, entered and left around the fork, its OOM kills read and the
  cgroup removed (only when the daemon of the same run made one per job: a daemon alone in
  its cgroup, as under systemd);
- its private /dev/shm (a mount namespace and a tmpfs, as root), unmounted at the end, and
  the namespace released when the supervisor exits (beyond what a plain exit costs);
- the launch fence read (CLOCK_MONOTONIC against the cluster's `exec_by`);
- a supervisor starting the job and waiting for it (the smallest there is: a shell,
  `sh -c 'true; :'`);
- its exit record written and fsynced (file and directory), so the exit code survives a
  power cut (issue 5).

A step the daemon of the run does not take (no cgroup, not root) is left out and named
as such, so the floor is never padded with work gpusched skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from gpusched.processes import cgroups

# A step returns None (the call is timed) or the seconds it timed itself (in a child).
Step = Callable[[int], float | None]

# Moving a process into a cgroup takes the kernel's cgroup_threadgroup_rwsem for writing,
# which waits for an RCU grace period unless another move happened moments before (about
# 12 ms on this virtual machine, 0.03 ms right after another). Jobs that start and end
# back to back are tens of milliseconds apart, so each pays it: the step is timed after a
# pause, as a job meets it, not in a tight loop that would keep the lock warm.
CGROUP_PAUSE_S = 0.1
CGROUP_SAMPLES = 20

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_SLAVE, _MNT_DETACH = 0x2, 0x4, 0x4000, 1 << 19, 2


class Floor:
    """The floor's steps, kept open across rounds (one database, one scratch directory)."""

    def __init__(self, root: Path, cgroup_parent: cgroups.MemoryCgroup | None) -> None:
        self.root = root
        self.db = sqlite3.connect(root / "floor.db", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT)")
        self.db.execute("INSERT INTO jobs VALUES (1, 'queued')")
        self.job_dir = root / "jobs" / "1"
        self.cgroup_parent = cgroup_parent
        self.samples: dict[str, list[float]] = {}
        # The cgroup step right after another move: as a daemon that starts the grace
        # period early meets it (gpusched.processes.move_warmer). Not in the floor's sum.
        self.warm_cgroup: list[float] = []
        self.skipped: dict[str, str] = {}
        self.true = shutil.which("true") or "/bin/true"
        self.shell = shutil.which("sh") or "/bin/sh"

    def close(self) -> None:
        self.db.close()

    def steps(self) -> list[tuple[str, Step | None, str]]:
        """(name, step or None, why it is left out) in a job's order."""
        root = os.geteuid() == 0
        no_cgroup = "the daemon of this run made no cgroup per job"
        return [
            ("start committed (SQLite WAL, synchronous=FULL)", self.commit, ""),
            ("spec written (job dir, renamed into place, no fsync)", self.spec_written, ""),
            ("supervisor identity recorded and read back", self.identity, ""),
            ("spec read and deleted", self.spec_deleted, ""),
            ("job log created (O_EXCL, owned by its owner)", self.log_created, ""),
            (
                "oom_score_adj: job's set around its fork, restored",
                self.oom_score_adj if root else None,
                "not root: the daemon leaves scores alone",
            ),
            (
                "cgroup: made, entered and left, OOM kills read, removed",
                self.cgroup if self.cgroup_parent is not None else None,
                no_cgroup,
            ),
            (
                "private /dev/shm: namespace + tmpfs, unmounted",
                self.private_shm if root else None,
                "not root: jobs share /dev/shm",
            ),
            ("launch fence read (CLOCK_MONOTONIC vs exec_by)", self.fence, ""),
            ("a supervisor starts the job (`sh -c 'true; :'`)", self.supervised_job, ""),
            ("exit record fsynced (file + directory)", self.exit_record, ""),
        ]

    def measure(self, samples: int) -> None:
        """Add `samples` timings of each step (one round)."""
        for name, step, why in self.steps():
            if step is None:
                self.skipped[name] = why
                continue
            taken = self.samples.setdefault(name, [])
            paced = step == self.cgroup
            for i in range(min(samples, CGROUP_SAMPLES) if paced else samples):
                self._prepare(name)
                if paced:  # the cadence of real jobs (see CGROUP_PAUSE_S), not timed
                    time.sleep(CGROUP_PAUSE_S)
                began = time.perf_counter()
                own = step(i)
                taken.append(time.perf_counter() - began if own is None else own)
                if paced:
                    self._warm_move()
                    self._prepare(name)
                    began = time.perf_counter()
                    step(samples + i)
                    self.warm_cgroup.append(time.perf_counter() - began)
        if os.geteuid() == 0:
            name = "its mount namespace released at exit (beyond a plain exit)"
            self.samples.setdefault(name, []).extend(_namespace_release(samples))

    def medians(self) -> dict[str, float]:
        """Each measured step's median (s), in a job's order."""
        return {name: statistics.median(taken) for name, taken in self.samples.items()}

    # -- what each step needs in place beforehand (not timed) ---------------------------

    def _prepare(self, name: str) -> None:
        if name.startswith("spec written"):
            shutil.rmtree(self.job_dir, ignore_errors=True)
        elif name.startswith("spec read"):
            (self.job_dir / "spec.json").write_text(json.dumps(_SPEC))
        elif name.startswith("supervisor identity"):
            with contextlib.suppress(FileNotFoundError):
                (self.job_dir / "supervisor.json").unlink()

    # -- the steps ----------------------------------------------------------------------

    def commit(self, i: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("UPDATE jobs SET state = ? WHERE id = 1", (f"running {i}",))
        self.db.execute("COMMIT")

    def spec_written(self, _i: int) -> None:
        self.job_dir.mkdir(parents=True, mode=0o700)
        _write_replace(self.job_dir / "spec.json", json.dumps(_SPEC).encode())

    def identity(self, i: int) -> None:
        path = self.job_dir / "supervisor.json"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        os.write(fd, json.dumps({"pid": os.getpid(), "start_ticks": i}).encode())
        os.close(fd)
        json.loads(path.read_bytes())

    def spec_deleted(self, _i: int) -> None:
        path = self.job_dir / "spec.json"
        json.loads(path.read_bytes())
        path.unlink()

    def log_created(self, _i: int) -> None:
        path = self.job_dir / "job.log"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_APPEND
        fd = os.open(path, flags, 0o600)
        if os.geteuid() == 0:
            os.fchown(fd, 65534, 65534)
        os.close(fd)

    def oom_score_adj(self, _i: int) -> None:
        before = cgroups.oom_score_adj() or 0
        cgroups.set_oom_score_adj(cgroups.job_score_adj(before))
        cgroups.set_oom_score_adj(before)

    def _warm_move(self) -> None:
        home = cgroups.own_memory_cgroup()
        if home is not None:
            home.add(os.getpid())

    def cgroup(self, i: int) -> None:
        assert self.cgroup_parent is not None
        home = cgroups.own_memory_cgroup()
        job = self.cgroup_parent.child(f"floor-job-{i}")
        job.path.mkdir()
        job.add(os.getpid())
        if home is not None:
            home.add(os.getpid())
        job.oom_kills()
        cgroups.remove_job_cgroup(job)

    def private_shm(self, _i: int) -> float:
        # In a child: a namespace is for good. The fork and the child's exit are not
        # timed here (a supervisor exists anyway); the namespace's release at exit is
        # its own step (`_namespace_release`).
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)
            began = time.perf_counter()
            libc.unshare(_CLONE_NEWNS)
            libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None)
            libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777")
            libc.umount2(b"/dev/shm", _MNT_DETACH)
            os.write(write_end, repr(time.perf_counter() - began).encode())
            os._exit(0)
        os.close(write_end)
        taken = float(os.read(read_end, 64))
        os.close(read_end)
        os.waitpid(pid, 0)
        return taken

    def fence(self, _i: int) -> None:
        exec_by = time.monotonic() + 60.0
        if time.monotonic() >= exec_by:
            raise AssertionError("the fence is read against a deadline a minute away")

    def supervised_job(self, _i: int) -> None:
        # The smallest supervisor there is: a shell (dash on Debian) that starts the job,
        # waits for it and runs one builtin after it. gpusched's is a forked Python.
        os.waitpid(os.posix_spawn(self.shell, [self.shell, "-c", f"{self.true}; :"], {}), 0)

    def exit_record(self, i: int) -> None:
        record = self.root / "exit.json"
        _write_replace(record, json.dumps({"outcome": "exit", "exit_code": 0, "i": i}).encode())
        dir_fd = os.open(self.root, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)


def _write_replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.write(fd, data)
    if path.name == "exit.json":
        os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)


def _namespace_release(samples: int) -> list[float]:
    """How much longer a child's exit takes to be seen with a mount namespace of its own
    (with a private /dev/shm) than without: the kernel releases the namespace's mounts
    before the exit is reported (a supervisor's exit is what the daemon waits for)."""

    def exit_seen(private: bool) -> float:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            if private:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.unshare(_CLONE_NEWNS)
                libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None)
                libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777")
                libc.umount2(b"/dev/shm", _MNT_DETACH)
            os.write(write_end, b"x")
            os._exit(0)
        os.close(write_end)
        os.read(read_end, 1)
        began = time.perf_counter()
        os.waitpid(pid, 0)
        os.close(read_end)
        return time.perf_counter() - began

    plain = statistics.median(exit_seen(False) for _ in range(samples))
    return [max(0.0, exit_seen(True) - plain) for _ in range(samples)]


def scratch_cgroup(name: str) -> cgroups.MemoryCgroup | None:
    """A new memory cgroup under this process's own, or None where there is none to make."""
    own = cgroups.own_memory_cgroup()
    if own is None or os.geteuid() != 0:
        return None
    made = own.child(f"{name}-{os.getpid()}")
    try:
        made.path.mkdir()
    except OSError:
        return None
    return made


def remove_cgroup_tree(cgroup: cgroups.MemoryCgroup) -> None:
    """Kill what is left in it and in the cgroups under it, then remove them all."""
    for child in [p for p in cgroup.path.iterdir() if p.is_dir()]:
        remove_cgroup_tree(cgroups.MemoryCgroup(child, cgroup.version))
    cgroups.kill_all(cgroup)
    cgroups.remove_job_cgroup(cgroup, wait_s=5.0)


_SPEC = {
    "job_id": 1,
    "argv": ["true"],
    "cwd": "/tmp",
    "env": {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "CUDA_VISIBLE_DEVICES": "0"},
    "uid": 65534,
    "gid": 65534,
    "groups": [],
    "umask": 18,
    "log_path": "/tmp/1.log",
    "kill_grace_s": 10.0,
    "time_limit_s": None,
    "private_shm": True,
    "exec_by": None,
}
