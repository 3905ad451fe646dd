"""On cgroup v2 a job opens only its own cards too: a BPF device program fences it.

This machine is cgroup v1 with a hybrid v2 hierarchy at /sys/fs/cgroup/unified, whose BPF
device programs the kernel runs beside v1's devices controller. The daemon is started
where v1's devices hierarchy is not mounted (a mount namespace of its own) and in a cgroup
of its own in the v2 hierarchy, as on a machine with no v1 devices controller: it lays its
devices cgroups out there and attaches a device program to each job's. As in
tests/security/test_devices.py, mallory's job ignores CUDA_VISIBLE_DEVICES and opens the
nodes of both cards (mknod'ed, minors 5 and 2, not the indices) and the control node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpusched.client import Client
from gpusched.processes import device_program
from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml import state as fakestate
from tests.fakenvml.fixtures import FakeNvml
from tests.security.test_devices import CONTROL_MINOR, MINORS, _node, _open_as
from tests.users import User, as_user

UNIFIED = Path("/sys/fs/cgroup/unified")


def _why_not() -> str | None:
    if not (UNIFIED / "cgroup.procs").exists() or not Path("/sys/fs/cgroup/devices").is_dir():
        return "plays v2 on a hybrid machine (v1's devices and a v2 hierarchy at .../unified)"
    return device_program.unavailable()


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def test_a_job_on_cgroup_v2_gets_eperm_on_the_other_cards_node_and_not_on_its_own(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    mallory, _victim = people
    gpus = fakestate.make_gpus([24 * fakestate.GiB] * 2)
    for gpu, minor in zip(gpus, MINORS, strict=True):
        gpu.minor = minor
    fake_nvml.set_gpus(gpus)
    daemon = root_daemon(simulate=None, env=fake_nvml.env(), v2_devices=True)
    eventually(lambda: len(daemon.status()["gpus"]) == 2, 30)
    assert "GPUs fenced per job: BPF device programs on" in daemon.stderr()
    nodes = daemon.root / "nodes"
    nodes.mkdir(mode=0o755)
    paths = [_node(nodes, f"nvidia-minor{m}", m) for m in MINORS]
    paths.append(_node(nodes, "nvidiactl", CONTROL_MINOR))
    ran = _open_as(daemon, mallory, paths)
    [given] = ran["job"]["gpu_indices"]
    opened = ran["opened"]
    assert opened[f"nvidia-minor{MINORS[1 - given]}"] == "EPERM", opened
    assert opened[f"nvidia-minor{MINORS[given]}"] == "ENXIO", opened  # no driver behind it
    assert opened["nvidiactl"] == "ENXIO", opened
    assert opened["CUDA_VISIBLE_DEVICES"] == ran["job"]["gpu_uuids"][0]
    # The job's cgroup v2, beside the daemon's leaf, went with its end.
    [service] = [c for c in daemon.limits.cgroups if c.is_relative_to(UNIFIED)]  # type: ignore[attr-defined]
    assert (service / "daemon").is_dir()
    eventually(lambda: not (service / f"job-{ran['job']['id']}").exists(), 10)


def test_a_job_given_every_card_on_cgroup_v2_is_denied_none(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    mallory, _victim = people
    gpus = fakestate.make_gpus([24 * fakestate.GiB] * 2)
    for gpu, minor in zip(gpus, MINORS, strict=True):
        gpu.minor = minor
    fake_nvml.set_gpus(gpus)
    daemon = root_daemon(simulate=None, env=fake_nvml.env(), v2_devices=True)
    eventually(lambda: len(daemon.status()["gpus"]) == 2, 30)
    nodes = daemon.root / "nodes"
    nodes.mkdir(mode=0o755)
    paths = [_node(nodes, f"nvidia-minor{m}", m) for m in MINORS]
    opened = _open_as(daemon, mallory, paths, gpus=2)["opened"]
    assert "EPERM" not in opened.values(), opened


def test_a_restarted_daemon_on_cgroup_v2_fences_the_next_job_too(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    """A restart finds the running job's supervisor in SERVICE/daemon of the v2 hierarchy,
    not beside it in SERVICE: the service is still the daemon's alone, and fenced."""
    mallory, _victim = people
    gpus = fakestate.make_gpus([24 * fakestate.GiB] * 2)
    for gpu, minor in zip(gpus, MINORS, strict=True):
        gpu.minor = minor
    fake_nvml.set_gpus(gpus)
    daemon = root_daemon(simulate=None, env=fake_nvml.env(), v2_devices=True)
    eventually(lambda: len(daemon.status()["gpus"]) == 2, 30)
    socket_path = daemon.socket_path
    running = int(as_user(mallory, lambda: Client(socket_path).submit(["sleep", "60"], gpus=1).id))
    daemon.wait_state(running, {"running"})
    daemon.stop()
    daemon.start()
    eventually(lambda: len(daemon.status()["gpus"]) == 2, 30)
    nodes = daemon.root / "nodes"
    nodes.mkdir(mode=0o755)
    paths = [_node(nodes, f"nvidia-minor{m}", m) for m in MINORS]
    ran = _open_as(daemon, mallory, paths)
    [given] = ran["job"]["gpu_indices"]
    assert ran["opened"][f"nvidia-minor{MINORS[1 - given]}"] == "EPERM", ran["opened"]
    assert ran["opened"][f"nvidia-minor{MINORS[given]}"] == "ENXIO", ran["opened"]
