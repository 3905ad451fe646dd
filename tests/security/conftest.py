"""The security suite's stage: a root daemon under the systemd unit's limits, and local users.

Every test here plays an unprivileged local user (a throw-away Unix account) against a
daemon running as root, as on a lab server. The daemon is started with what
`systemd/gpusched.service` gives it, read from that file so the two stay in step:
`UMask=`, `LimitNOFILE=` (soft limit; systemd's default 1024 without it), and, where this
machine lets a test make cgroups, `TasksMax=` and `MemoryMax=` as a pids and a memory
cgroup around the daemon and everything it starts (jobs included, as under systemd), and
on cgroup v1 a devices cgroup of its own, as systemd gives a unit with `Delegate=yes`.
`v2_devices=True` plays a machine without v1's devices hierarchy on this hybrid one: the
daemon runs in a mount namespace where /sys/fs/cgroup/devices is not mounted, in a cgroup
of its own in the unified (v2) hierarchy, so it fences cards with BPF device programs.

Fixtures:
- `people`: (mallory, victim), two users who share no group; module-scoped.
- `root_daemon(simulate=..., env=..., v2_devices=..., **config)`: a started daemon in a
  directory every
  user can traverse, stopped (and its jobs killed) after the test; `.limits` says which
  limits applied.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.units import parse_size
from tests.daemon_harness import RunningDaemon
from tests.users import User, throwaway_users

UNIT_FILE = Path(__file__).resolve().parents[2] / "systemd" / "gpusched.service"
SYSTEMD_DEFAULT_NOFILE = 1024


@dataclass
class UnitLimits:
    """What the unit file sets, and which of it this machine could apply to a test daemon."""

    umask: int = 0o022
    nofile: int = SYSTEMD_DEFAULT_NOFILE
    tasks_max: int | None = None
    memory_max_bytes: int | None = None
    cgroups: list[Path] = field(default_factory=list)  # made for one daemon, removed after

    @classmethod
    def from_unit(cls, text: str) -> UnitLimits:
        keys = dict(
            re.findall(r"^(UMask|LimitNOFILE|TasksMax|MemoryMax)=(\S+)", text, re.MULTILINE)
        )
        limits = cls()
        if "UMask" in keys:
            limits.umask = int(keys["UMask"], 8)
        if "LimitNOFILE" in keys:
            limits.nofile = int(keys["LimitNOFILE"].split(":")[0])
        if keys.get("TasksMax", "infinity") not in ("infinity", ""):
            value = keys["TasksMax"]
            limits.tasks_max = (
                int(value)
                if not value.endswith("%")
                else int(Path("/proc/sys/kernel/pid_max").read_text()) * int(value[:-1]) // 100
            )
        if keys.get("MemoryMax", "infinity") not in ("infinity", ""):
            value = keys["MemoryMax"]
            limits.memory_max_bytes = (
                parse_size(value)
                if not value.endswith("%")
                else _mem_total_bytes() * int(value[:-1]) // 100
            )
        return limits


def _mem_total_bytes() -> int:
    """Physical memory, as systemd reads it for `MemoryMax=N%`."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _make_cgroup(controller: str, name: str, v1: dict[str, str], v2: dict[str, str]) -> Path | None:
    """A cgroup named `name` with its limits written, or None where this machine refuses.

    cgroup v1 (a hierarchy per controller) or v2 (one unified hierarchy).
    """
    if (CGROUP_ROOT / controller).is_dir():
        path, settings = CGROUP_ROOT / controller / name.lstrip("/"), v1
    elif (CGROUP_ROOT / "cgroup.controllers").exists():
        path, settings = CGROUP_ROOT / name.lstrip("/"), v2
    else:
        return None
    try:
        path.mkdir()
        for key, value in settings.items():
            (path / key).write_text(value)
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def _without_v1_devices(then: Callable[[], None]) -> Callable[[], None]:
    """`then`, and the process in a mount namespace of its own without v1's devices
    hierarchy mounted (ctypes: os.unshare is Python 3.12's)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: not between fork and exec

    def apply() -> None:
        then()
        ms_rec, ms_private, mnt_detach = 0x4000, 0x40000, 2
        if (
            libc.unshare(0x00020000) != 0  # CLONE_NEWNS
            or libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0
            or libc.umount2(str(CGROUP_ROOT / "devices").encode(), mnt_detach) != 0
        ):
            raise OSError(ctypes.get_errno(), "cannot hide the devices hierarchy")

    return apply


def unit_limits_preexec(limits: UnitLimits) -> Callable[[], None]:
    """What runs in the daemon's process before exec: the unit's umask, files and cgroups."""

    def apply() -> None:
        os.umask(limits.umask)
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(limits.nofile, hard), hard))
        for cgroup in limits.cgroups:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return apply


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[User, User]]:
    with throwaway_users(2, extra_group=False) as (made, _group):
        yield made[0], made[1]


@pytest.fixture
def root_daemon() -> Iterator[Callable[..., RunningDaemon]]:
    """Start root daemons under the unit's limits: root_daemon(simulate=..., env=..., **config)."""
    if os.geteuid() != 0:
        pytest.skip("the security suite plays users against a root daemon: needs root")
    made: list[tuple[RunningDaemon, UnitLimits]] = []

    def make(
        simulate: str | None = "2x24G",
        env: dict[str, str] | None = None,
        v2_devices: bool = False,
        **config: Any,
    ) -> RunningDaemon:
        root = Path(tempfile.mkdtemp(prefix="gpusched-sec-", dir="/tmp"))
        root.chmod(0o755)
        limits = UnitLimits.from_unit(UNIT_FILE.read_text())
        tag = root.name
        if limits.tasks_max is not None:
            tasks = {"pids.max": str(limits.tasks_max)}
            cgroup = _make_cgroup("pids", f"{_own_cgroup('pids')}/{tag}", tasks, tasks)
            if cgroup is not None:
                limits.cgroups.append(cgroup)
        if limits.memory_max_bytes is not None:
            cgroup = _make_cgroup(
                "memory",
                f"{_own_cgroup('memory')}/{tag}",
                {"memory.limit_in_bytes": str(limits.memory_max_bytes)},
                {"memory.max": str(limits.memory_max_bytes)},
            )
            if cgroup is not None:
                limits.cgroups.append(cgroup)
        if v2_devices:
            unified = CGROUP_ROOT / "unified" / _own_cgroup("").lstrip("/") / tag
            unified.mkdir()
            limits.cgroups.append(unified)
        elif (CGROUP_ROOT / "devices").is_dir():
            cgroup = _make_cgroup("devices", f"{_own_cgroup('devices')}/{tag}", {}, {})
            if cgroup is not None:
                limits.cgroups.append(cgroup)
        preexec = unit_limits_preexec(limits)
        if v2_devices:
            preexec = _without_v1_devices(preexec)
        daemon = RunningDaemon(root, simulate=simulate, config=config, env=env, preexec=preexec)
        daemon.limits = limits  # type: ignore[attr-defined]
        made.append((daemon, limits))
        return daemon.start()

    yield make
    for daemon, limits in made:
        daemon.stop()
        daemon.kill_jobs()
        for cgroup in limits.cgroups:
            _remove_cgroup(cgroup)
        shutil.rmtree(daemon.root, ignore_errors=True)


def _own_cgroup(controller: str) -> str:
    """This process's path in a v1 controller's hierarchy (where a child cgroup may be made)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _num, names, path = line.split(":", 2)
        if controller in names.split(",") or names == "":  # "" is v2's unified line
            return path
    return "/"


def _remove_cgroup(cgroup: Path) -> None:
    """Kill what is left inside (jobs outlive the daemon by design), then remove it with
    the cgroups the daemon made under it (its own leaf, one per job)."""
    import signal
    import time

    with contextlib.suppress(OSError):
        for child in cgroup.iterdir():
            if child.is_dir():
                _remove_cgroup(child)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        cgroup.rmdir()
