"""Memory protection and the cgroup layout: no job's memory can take the daemon down.

Under systemd the daemon, the zygote, the supervisors and every job share the service's
memory cgroup (`MemoryMax=`). At that cap the kernel's OOM killer picks the process with
the largest badness (resident memory plus `oom_score_adj` times the cap / 1000), so
without protection a job of 200 processes of 10 MB each gets the 40 MB daemon killed
first. Hence:

- `OOM_SCORE_ADJ_PROTECTED` (-900) for the daemon, inherited by the zygote and every
  supervisor (and `OOMScoreAdjust=` in the unit): one of them is chosen only once it
  holds 90 % of the cap more than any job process. A job runs at 0: right after its
  fork the supervisor writes that to every process in the job's cgroup
  (`raise_job_scores`), never holding it itself, so the job and all it forks run at 0;
  a job's owner cannot lower it again (that takes CAP_SYS_RESOURCE). Not -1000: a group
  where nothing may be killed hangs. What matters is the gap: where the daemon cannot
  lower its own score (a container without CAP_SYS_RESOURCE, as in this project's CI),
  the job starts at +900 instead (`job_score_adj`); there the job's owner could lower
  it back to 0, which is why the unit sets `OOMScoreAdjust=` (docs/operations.md,
  "Security model").
- one cgroup layout (docs/operations.md, "Memory and cgroups"), under the cgroup the
  daemon starts in (the service's, `Delegate=yes`): `SERVICE/daemon` holds the daemon,
  the zygote and the supervisors; `SERVICE/job-ID` holds one job's processes. Not a
  systemd scope per job: a scope is outside the service and escapes its `MemoryMax=`.
  The job's cgroup counts the kernel's OOM kills of that job alone (`oom_kills`), which
  is how a job killed for host memory is told apart (`host_oom`).

cgroup v2 (one hierarchy, memory controller enabled) and v1 (its `memory` hierarchy) are
both handled; without a writable memory cgroup (not root, or no cgroup file system)
jobs run in the daemon's cgroup as before, with the score protection alone.

Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

OOM_SCORE_ADJ_PROTECTED = -900
OOM_SCORE_ADJ_GAP = 900  # a job's score above its supervisor's
DAEMON_LEAF = "daemon"


def set_oom_score_adj(value: int, pid: int | str = "self") -> bool:
    """Write `value` to the process's oom_score_adj; False where the kernel refuses."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(value))
    except OSError:
        return False
    return True


def job_score_adj(supervisor: int) -> int:
    """A job's oom_score_adj: OOM_SCORE_ADJ_GAP above its supervisor's, within 0..1000."""
    return max(0, min(1000, supervisor + OOM_SCORE_ADJ_GAP))


def oom_score_adj(pid: int | str = "self") -> int | None:
    try:
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup: its directory and the hierarchy's version (1 or 2)."""

    path: Path
    version: int

    def child(self, name: str) -> MemoryCgroup:
        return MemoryCgroup(self.path / name, self.version)

    def procs(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def add(self, pid: int) -> None:
        """Move `pid` (and, on v2, all its threads) into this cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def _file(self, v1: str, v2: str) -> Path:
        return self.path / (v2 if self.version == 2 else v1)

    def set_limit(self, limit_bytes: int) -> None:
        """Cap this cgroup's memory (tmpfs and SysV pages its processes wrote included): at
        the cap the kernel reclaims, then kills within this cgroup only."""
        self._file("memory.limit_in_bytes", "memory.max").write_text(str(limit_bytes))

    def limit(self) -> int | None:
        """This cgroup's own cap, None where it has none (or it cannot be read)."""
        try:
            text = self._file("memory.limit_in_bytes", "memory.max").read_text().strip()
        except OSError:
            return None
        return None if text == "max" or not text.isdigit() else int(text)

    def peak(self) -> int | None:
        """The most memory this cgroup held at once (v2 without memory.peak: None)."""
        try:
            return int(self._file("memory.max_usage_in_bytes", "memory.peak").read_text())
        except (OSError, ValueError):
            return None

    def reached_limit(self) -> bool:
        """Whether this cgroup's own cap was ever reached (not an ancestor's)."""
        if self.version == 2:
            return _event(self.path / "memory.events.local", "max") > 0
        try:
            return int((self.path / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def oom_kills(self) -> int:
        """How many of this cgroup's processes the kernel's OOM killer has killed."""
        return _event(self._file("memory.oom_control", "memory.events"), "oom_kill")


def _event(path: Path, name: str) -> int:
    """A counter of memory.events (v2) or memory.oom_control (v1): `NAME COUNT` lines."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    match = re.search(rf"^{name} (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def memory_total() -> int:
    """The machine's memory (MemTotal)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def memory_budget(service: MemoryCgroup) -> int:
    """The memory the service may use in all: the lowest cap on the way from its cgroup to
    the root (v1 says it as `hierarchical_memory_limit`), at most the machine's."""
    total = memory_total()
    if service.version == 1:
        stat = (service.path / "memory.stat").read_text()
        match = re.search(r"^hierarchical_memory_limit (\d+)$", stat, re.MULTILINE)
        return min(total, int(match.group(1))) if match else total
    lowest, path = total, service.path
    while (path / "memory.max").exists():
        own = MemoryCgroup(path, 2).limit()
        lowest = min(lowest, own) if own is not None else lowest
        path = path.parent
    return lowest


def mounts() -> Iterator[tuple[str, Path, str, str]]:
    """(root within the hierarchy, mount point, file system type, super options)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            root, point = fields[3], Path(fields[4].replace("\\040", " "))
            yield root, point, fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""


def under(mount_root: str, mount_point: Path, path: str) -> Path | None:
    """Where the cgroup `path` of a hierarchy mounted from `mount_root` lies, if visible."""
    root = mount_root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount_point / path[len(root) :].lstrip("/")


def own_v1_cgroup(controller: str, pid: int | str = "self") -> Path | None:
    """The cgroup `pid` is in within v1's `controller` hierarchy (cpuset, devices...),
    where that hierarchy is mounted and visible; None otherwise."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    path = next(
        (ln.split(":", 2)[2] for ln in lines if controller in ln.split(":", 2)[1].split(",")),
        None,
    )
    if path is None:
        return None
    for root, point, fstype, options in mounts():
        if fstype == "cgroup" and controller in options.split(","):
            where = under(root, point, path)
            if where is not None:
                return where
    return None


def own_memory_cgroup(pid: int | str = "self") -> MemoryCgroup | None:
    """The memory cgroup `pid` is in (v1's memory hierarchy where there is one, else v2's
    unified one with the memory controller), or None where none is mounted."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:
        _num, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1_path = path
        elif controllers == "":
            v2_path = path
    for root, point, fstype, options in mounts():
        if v1_path is not None and fstype == "cgroup" and "memory" in options.split(","):
            where = under(root, point, v1_path)
            if where is not None:
                return MemoryCgroup(where, 1)
    if v1_path is not None:
        return None
    for root, point, fstype, _options in mounts():
        if v2_path is not None and fstype == "cgroup2":
            where = under(root, point, v2_path)
            if where is not None and _v2_has_memory(where):
                return MemoryCgroup(where, 2)
    return None


def _v2_has_memory(path: Path) -> bool:
    try:
        return "memory" in (path / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def prepare_service(service: MemoryCgroup | None = None) -> MemoryCgroup | None:
    """At the daemon's start: move it (and anything else in the service's own cgroup) into
    `SERVICE/daemon` and let jobs have cgroups beside it; returns the service's cgroup.

    A daemon restarted by systemd starts in the service's cgroup again; one started in
    its own leaf already (a restart outside systemd) keeps the same service. None where
    the cgroup cannot be written, or where it is not the daemon's alone (started by hand
    from a shell: the shell's session is not ours to move): jobs then share the daemon's
    cgroup.
    """
    service = service or own_memory_cgroup()
    if service is None or os.geteuid() != 0:
        return None
    if service.path.name == DAEMON_LEAF:
        service = MemoryCgroup(service.path.parent, service.version)
    if set(service.procs()) - {os.getpid()}:
        return None
    leaf = service.child(DAEMON_LEAF)
    try:
        leaf.path.mkdir(exist_ok=True)
        for pid in service.procs():
            with contextlib.suppress(ProcessLookupError):
                leaf.add(pid)
        if service.version == 2 and _v2_has_memory(service.path):
            # v2's "no internal processes" rule: controllers are enabled for children only
            # once the parent holds no process (just done above). The devices layout on a
            # hybrid machine's v2 hierarchy has no memory controller, and needs none.
            (service.path / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    return service


@contextlib.contextmanager
def job_fork(cgroup: MemoryCgroup | None) -> Iterator[None]:
    """Around the fork of a job: the calling (single-threaded) supervisor is in the job's
    cgroup, so the job is in it from the fork itself and nothing it starts early escapes;
    then the supervisor goes back to its own cgroup. It keeps its own protection
    throughout: holding the job's score there, it was for that moment the largest
    process of the job at the job's score, the kernel's first choice when the service ran
    out of memory (and the job ended `lost`). The job gets its score after the fork
    (`raise_job_scores`)."""
    home = own_memory_cgroup() if cgroup is not None else None
    moved = False
    if cgroup is not None:
        try:
            cgroup.add(os.getpid())
            moved = True
        except OSError:
            pass
    try:
        yield
    finally:
        if moved and home is not None:
            with contextlib.suppress(OSError):
                home.add(os.getpid())


def raise_job_scores(pids: Callable[[], list[int]], rounds: int = 100) -> None:
    """Right after a job's fork: every process of the job (`pids`, read afresh each round)
    to the job's oom_score_adj (`job_score_adj` of the caller's), until none is left
    below it. The job runs its first instructions at its supervisor's score; whatever it
    forked meanwhile is in `pids` too (its cgroup), and written here in its turn. Root's
    write also sets the process's floor (`oom_score_adj_min`): the job's owner cannot
    take it back down. A user's own daemon (single-user mode) leaves its jobs' scores
    alone: they would otherwise be the machine's first choice, before the user's desktop
    and shell."""
    own = oom_score_adj() if os.geteuid() == 0 else None
    if own is None:
        return
    score = job_score_adj(own)
    for _ in range(rounds):
        scores = {pid: oom_score_adj(pid) for pid in pids()}  # None: it has exited
        behind = [pid for pid, now in scores.items() if now is not None and now < score]
        if not behind:
            return
        for pid in behind:
            set_oom_score_adj(score, pid)


def hook_cgroup(name: str) -> MemoryCgroup | None:
    """A new cgroup `SERVICE/NAME` beside the daemon's leaf, for a notification hook (so
    that at its end nothing it started, even in a new session, is left running); None
    where the daemon has no such layout (prepare_service did not run or could not)."""
    own = own_memory_cgroup()
    if own is None or own.path.name != DAEMON_LEAF or os.geteuid() != 0:
        return None
    cgroup = MemoryCgroup(own.path.parent / name, own.version)
    try:
        cgroup.path.mkdir()
    except OSError:
        return None
    return cgroup


def kill_all(cgroup: MemoryCgroup, attempts: int = 100) -> None:
    """SIGKILL every process in `cgroup` until it is empty (or `attempts` rounds)."""
    import signal
    import time

    kill_file = cgroup.path / "cgroup.kill"  # v2 (5.14+): the kernel kills them all at once
    with contextlib.suppress(OSError):
        if kill_file.exists():
            kill_file.write_text("1")
    for _ in range(attempts):
        pids = cgroup.procs()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def remove_job_cgroup(cgroup: MemoryCgroup, wait_s: float = 2.0) -> None:
    """Remove a job's (empty) cgroup; its last processes may take a moment to leave."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            cgroup.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)
