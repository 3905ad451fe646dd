"""Device fencing: a job opens only the device nodes of the GPUs it was given.

`CUDA_VISIBLE_DEVICES` is only an environment variable: a job that unsets it, or a
library that ignores it, would open every card. As Slurm's `ConstrainDevices`, each job's
cgroup in cgroup v1's `devices` hierarchy denies the nodes of the other cards, and only
those: `c 195:M` (`/dev/nvidiaM`, M the minor number NVML reports for the card, which need
not be its index) and that card's MIG capability nodes (`nvidia-caps`, listed by the
driver under /proc/driver/nvidia/capabilities/gpuM). Everything else stays as the
service's cgroup allows it: the control nodes (`/dev/nvidiactl` 195:255,
`/dev/nvidia-modeset` 195:254), `nvidia-uvm`, `/dev/pts`, `/dev/fuse`, InfiniBand.

The layout mirrors the memory one (gpusched.processes.cgroups): under the devices cgroup the
daemon starts in (the service's), `SERVICE/daemon` holds the daemon, the zygote and the
supervisors, and `SERVICE/job-ID` one job, with its deny rules written by the supervisor
before the job's fork. The devices controller checks a node at its open, wherever the node
lives (a `mknod` in /tmp is denied too), and only root may write the rules or move a
process out of the cgroup.

cgroup v2 has no devices files: there the job's cgroup v2 (`SERVICE/job-ID`, on a v2-only
machine the memory layout's own directory) gets a BPF device program denying the same nodes
(gpusched.processes.device_program, as systemd's `DeviceAllow=`), attached by the supervisor
before the job's fork. Where no such program loads (checked at the daemon's start), jobs
are not fenced, which the daemon says at its start and `gpusched doctor` too
(docs/operations.md, "Security model"). Simulated GPUs have no nodes: nothing is fenced.

Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpusched.processes import cgroups, device_program

NVIDIA_MAJOR = 195  # /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-modeset
PROC = Path("/proc")


def _caps_major(proc: Path) -> int | None:
    """The `nvidia-caps` character major (dynamic: read from /proc/devices), if loaded."""
    try:
        text = (proc / "devices").read_text()
    except OSError:
        return None
    match = re.search(r"^\s*(\d+) nvidia-caps$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _caps_minors(card_minor: int, proc: Path) -> list[int]:
    """The minors of card `card_minor`'s capability nodes (its MIG instances): each
    `access` file under the driver's gpuM directory says `DeviceFileMinor: N`."""
    found: list[int] = []
    root = proc / "driver" / "nvidia" / "capabilities" / f"gpu{card_minor}"
    for access in sorted(root.rglob("access")):
        with contextlib.suppress(OSError):
            match = re.search(r"^DeviceFileMinor:\s*(\d+)", access.read_text(), re.MULTILINE)
            if match:
                found.append(int(match.group(1)))
    return found


def deny_rules(card_minors: Iterable[int], proc: Path = PROC) -> list[str]:
    """The `devices.deny` lines that fence off the cards with these minor numbers: each
    card's node and, where the driver lists them, its capability nodes."""
    caps = _caps_major(proc)
    rules: list[str] = []
    for minor in sorted(set(card_minors)):
        rules.append(f"c {NVIDIA_MAJOR}:{minor} rwm")
        if caps is not None:
            rules += [f"c {caps}:{cap} rwm" for cap in _caps_minors(minor, proc)]
    return rules


def own_devices_cgroup(pid: int | str = "self") -> Path | None:
    """The v1 devices cgroup `pid` is in, where that hierarchy is mounted and visible."""
    return cgroups.own_v1_cgroup("devices", pid)


def own_v2_cgroup(pid: int | str = "self") -> Path | None:
    """The cgroup v2 directory `pid` is in, where a v2 hierarchy is mounted and visible."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    for root, point, fstype, _options in cgroups.mounts():
        if path is not None and fstype == "cgroup2":
            where = cgroups.under(root, point, path)
            if where is not None:
                return where
    return None


def fencing_unavailable() -> str | None:
    """Why this machine cannot fence cards, in one line (None: it can, with cgroup v1's
    devices hierarchy or a BPF device program). Said at the daemon's start and by
    `gpusched doctor`."""
    if own_devices_cgroup() is not None:
        return None
    if own_v2_cgroup() is not None:
        why = device_program.unavailable()
        return None if why is None else f"cgroup v2: a job's GPUs are not fenced ({why})"
    return "no devices cgroup: a job's GPUs are not fenced"


def fenced_by() -> str:
    """How jobs are fenced here, where `fencing_unavailable` says they can be."""
    if own_devices_cgroup() is not None:
        return "cgroup v1 devices controller"
    return "a BPF device program on each job's cgroup v2"


@dataclass(frozen=True)
class DevicesService:
    """Where jobs' devices cgroups go (`path`/job-ID) and their hierarchy's version: v1's
    devices hierarchy, or v2's, fenced there by a device program."""

    path: Path
    version: int


def prepare_service() -> DevicesService | None:
    """At the daemon's start (root): its devices cgroup laid out as the memory one, the
    daemon moved into `SERVICE/daemon`; returns SERVICE, or None where that cannot be
    done or the cgroup is not the daemon's alone (gpusched.processes.cgroups.prepare_service).
    In v1's devices hierarchy where it is mounted, else in v2's where a device program
    loads here (on a v2-only machine the memory layout's own directories, no controller
    needed; on a hybrid one without v1's devices, the unified hierarchy's)."""
    own = own_devices_cgroup()
    if own is not None:
        service = cgroups.prepare_service(cgroups.MemoryCgroup(own, 1))
        return None if service is None else DevicesService(service.path, 1)
    v2 = own_v2_cgroup()
    if v2 is None or device_program.unavailable() is not None:
        return None
    service = cgroups.prepare_service(cgroups.MemoryCgroup(v2, 2))
    return None if service is None else DevicesService(service.path, 2)


class FenceError(OSError):
    """A job's devices cgroup could not be made: the job is not started."""


def make_job_cgroup(path: Path, rules: Iterable[str], version: int = 1) -> None:
    """Create a job's devices cgroup and write its deny rules (v1) or attach a device
    program denying them (v2); FenceError (the cgroup removed again) where any step is
    refused: a job is never started half fenced."""
    try:
        path.mkdir(exist_ok=True)
        if version == 2:
            device_program.fence(path, device_program.parse_rules(rules))
        else:
            for rule in rules:
                (path / "devices.deny").write_text(rule)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise FenceError(f"cannot fence off the GPUs it was not given: {exc}") from exc


@contextlib.contextmanager
def job_fork(path: Path | None, version: int = 1) -> Iterator[None]:
    """Around a job's fork: the supervisor in the job's devices cgroup, so the job is in it
    from its first instruction; then back to the supervisor's own (as cgroups.job_fork).
    The move in must not fail (a job outside would run unfenced): its error is the
    job's. On a v2-only machine the directory is the job's memory cgroup too."""
    if path is None:
        yield
        return
    home = own_v2_cgroup() if version == 2 else own_devices_cgroup()
    (path / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        if home is not None:
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(str(os.getpid()))


def remove_job_cgroup(path: Path) -> None:
    """Remove a job's devices cgroup once its processes are gone."""
    cgroups.remove_job_cgroup(cgroups.MemoryCgroup(path, 1))
