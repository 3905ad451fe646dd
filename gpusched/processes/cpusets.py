"""Each job's cores: a cpuset cgroup of its own, so that packed jobs' data loaders stay
off each other's cores (`--cpus N`, else its GPUs' share of the server's cores).

A cpuset, not a `cpu.max` quota: a quota lets every job run on every core, each within
its time, so two packed jobs' loaders still evict each other's caches and wait on the
same cores; a cpuset gives each its own cores, which also says in `show` which ones.
The daemon picks a running job's cores (`pick_cores`): those fewest other jobs hold,
lowest first, so jobs get disjoint sets while there are cores enough.

cgroup v1: a directory `gpusched-TAG` (TAG: of the daemon's state directory, so that two
daemons never share one) under the daemon's own cpuset cgroup, with a `job-ID` per job;
a v1 cpuset takes tasks only once its `cpuset.cpus` and `cpuset.mems` are written.
cgroup v2: the job's own cgroup beside the daemon's (gpusched.processes.cgroups), with
the cpuset controller enabled for the service's children and `cpuset.cpus` written.

Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpusched.processes import cgroups

NOT_ROOT = "the daemon does not run as root"


def parse_cpus(text: str) -> tuple[int, ...]:
    """ "0-3,6" -> (0, 1, 2, 3, 6): a cpuset's list of cores."""
    cores: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(cores)))


def format_cpus(cores: Iterable[int]) -> str:
    """(0, 1, 2, 3, 6) -> "0-3,6"."""
    ranges: list[list[int]] = []
    for core in sorted(set(cores)):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def pick_cores(cores: Sequence[int], taken: Iterable[Iterable[int]], count: int) -> tuple[int, ...]:
    """`count` of `cores` (all of them if fewer): those the fewest of `taken` (the other
    jobs' sets) hold, the lowest first among equals."""
    held = dict.fromkeys(cores, 0)
    for each in taken:
        for core in each:
            if core in held:
                held[core] += 1
    ranked = sorted(cores, key=lambda core: (held[core], core))
    return tuple(sorted(ranked[: max(1, count)]))


@dataclass(frozen=True)
class CpusetRoot:
    """Where the jobs' cpusets go, the cores they may take and (v1) the memory nodes."""

    path: Path
    version: int
    cores: tuple[int, ...]
    mems: str = ""

    def job(self, job_id: int) -> Path:
        return self.path / f"job-{job_id}"

    def in_use(self, but: int | None = None) -> list[tuple[int, ...]]:
        """The cores of each job's cpuset there now (but job `but`'s). One left empty for
        a while (its supervisor was killed before it could remove it) is removed: only a
        job just being started has an empty one."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.path):
                if not entry.name.startswith("job-") or entry.name == f"job-{but}":
                    continue
                with contextlib.suppress(OSError, ValueError):
                    if _stale(Path(entry.path)):
                        continue
                    found.append(parse_cpus(Path(entry.path, "cpuset.cpus").read_text()))
        return found


# How long a job's cpuset may stay empty before it counts as left behind: its supervisor
# joins it within a second of its making, unless the machine is very slow.
STALE_S = 120.0


def _stale(path: Path) -> bool:
    """Whether a job's cpuset was left behind (empty, and made long ago): then removed."""
    try:
        if (path / "cgroup.procs").read_text().strip():
            return False
        if time.time() - path.stat().st_mtime < STALE_S:
            return False
    except OSError:  # unreadable: counted as in use
        return False
    with contextlib.suppress(OSError):
        path.rmdir()
    return True


def _own_v1_cpuset() -> Path | None:
    """This process's cgroup in a mounted v1 cpuset hierarchy, None where there is none."""
    return cgroups.own_v1_cgroup("cpuset")


def _effective(path: Path, name: str) -> str:
    """A cpuset's effective cores or memory nodes (v1 without `effective_*`: its own)."""
    for candidate in (f"{name}.effective", f"{name.replace('.', '.effective_')}", name):
        with contextlib.suppress(OSError):
            text = (path / candidate).read_text().strip()
            if text:
                return text
    raise OSError(f"no {name} in {path}")


def unavailable() -> str | None:
    """Why a daemon started here could give its jobs no cpuset, in one line (None: it
    could: a v1 cpuset hierarchy, or v2 with the cpuset controller). Said by `doctor`."""
    if _own_v1_cpuset() is not None:
        return None
    own = cgroups.own_memory_cgroup()
    if own is not None and own.version == 2:
        with contextlib.suppress(OSError):
            if "cpuset" in (own.path / "cgroup.controllers").read_text().split():
                return None
    return "no cpuset cgroup to give a job its own cores"


def prepare_root(
    service: cgroups.MemoryCgroup | None, state_dir: Path, reserve: int
) -> CpusetRoot | str:
    """At the daemon's start (as root): where its jobs' cpusets go, or why there are none.
    `reserve`: how many of the cores (the first ones) no job gets."""
    if os.geteuid() != 0:
        return NOT_ROOT
    try:
        if service is not None and service.version == 2:
            if "cpuset" not in (service.path / "cgroup.controllers").read_text().split():
                return "no cpuset controller in the service's cgroup (cgroup v2)"
            (service.path / "cgroup.subtree_control").write_text("+cpuset")
            cores = parse_cpus(_effective(service.path, "cpuset.cpus"))
            return CpusetRoot(service.path, 2, cores[reserve:] or cores[-1:])
        own = _own_v1_cpuset()
        if own is None:
            return "no cpuset cgroup hierarchy mounted (cgroup v1)"
        tag = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:12]
        root = own / f"gpusched-{tag}"
        root.mkdir(exist_ok=True)
        cpus, mems = _effective(own, "cpuset.cpus"), _effective(own, "cpuset.mems")
        (root / "cpuset.cpus").write_text(cpus)
        (root / "cpuset.mems").write_text(mems)
        cores = parse_cpus(cpus)
        return CpusetRoot(root, 1, cores[reserve:] or cores[-1:], mems)
    except (OSError, ValueError) as exc:
        return f"cannot make cpuset cgroups ({exc})"


def release_root(root: CpusetRoot) -> None:
    """At a clean stop: a v1 root with no job's cpuset left under it goes."""
    if root.version == 1:
        with contextlib.suppress(OSError):
            root.path.rmdir()


def make_job_cpuset(path: Path, version: int, cpus: str, mems: str) -> None:
    """The job's cpuset (as root, before it starts): its cores, and on v1 its memory
    nodes (a v1 cpuset takes no task without both)."""
    path.mkdir(exist_ok=True)
    (path / "cpuset.cpus").write_text(cpus)
    if version == 1:
        (path / "cpuset.mems").write_text(mems)


@contextlib.contextmanager
def joined(path: Path | None) -> Iterator[None]:
    """Around the fork of a job (v1): the supervisor is in the job's cpuset, so the job is
    from its first instruction; then the supervisor goes back to its own."""
    home = _own_v1_cpuset() if path is not None else None
    moved = False
    if path is not None:
        try:
            (path / "cgroup.procs").write_text(str(os.getpid()))
            moved = True
        except OSError:
            pass
    try:
        yield
    finally:
        if moved and home is not None:
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(str(os.getpid()))


def remove_job_cpuset(path: Path) -> None:
    """Once the job has no process left: its (v1) cpuset goes."""
    cgroups.remove_job_cgroup(cgroups.MemoryCgroup(path, 1))


def assign(root: CpusetRoot, job_id: int, count: int) -> dict[str, object]:
    """Make job `job_id`'s cpuset (as root, before its supervisor starts) with `count`
    cores (`pick_cores`, against the jobs' cpusets there now: made here, in order, so
    that two jobs started in one pass see each other's); its entry of the job's spec."""
    cores = pick_cores(root.cores, root.in_use(but=job_id), count)
    path = root.job(job_id)
    make_job_cpuset(path, root.version, format_cpus(cores), root.mems)
    return {"path": str(path), "version": root.version, "cpus": format_cpus(cores)}


def confine(
    memory: cgroups.MemoryCgroup | None,
    root: CpusetRoot | str,
    job_id: int,
    pid: int,
    limits: tuple[int | None, int | None],
) -> None:
    """An interactive job's client process (`gpusched run`, claim()), before it learns its
    placement, into cgroups of the job's own, as a supervisor puts a batch job: a memory
    cgroup capped at `limits`' --ram (`memory`: the service's, where jobs have one), a
    cpuset of its --cpus; the command it then starts is born in them. Its owner cannot
    move it out: the cgroups are root's. OSError where the kernel refuses."""
    ram, cpus = limits
    if ram is not None and memory is not None:
        own = memory.child(f"job-{job_id}")
        own.path.mkdir(exist_ok=True)
        own.set_limit(ram)
        own.add(pid)
    if cpus and not isinstance(root, str):
        path = Path(str(assign(root, job_id, cpus)["path"]))
        (path / "cgroup.procs").write_text(str(pid))


# How long an ended interactive job's cgroups are waited for to empty (its client exits
# right after it reports the end; one that lives on keeps them, and its limits).
RELEASE_WAIT_S = 60.0


def release(memory: cgroups.MemoryCgroup | None, root: CpusetRoot | str, job_id: int) -> None:
    """An interactive job's cgroups once it has ended, as they empty (its client gone)."""
    if memory is not None:
        cgroups.remove_job_cgroup(memory.child(f"job-{job_id}"), wait_s=RELEASE_WAIT_S)
    if not isinstance(root, str) and root.version == 1:
        path = cgroups.MemoryCgroup(root.job(job_id), 1)
        cgroups.remove_job_cgroup(path, wait_s=RELEASE_WAIT_S)
