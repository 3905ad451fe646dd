"""One contract for every GPU probe (STYLE.md #8): what the daemon may rely on.

The same assertions run against the simulated probe and the NVML probe on the fake driver
(tests/fakenvml). A probe-specific detail belongs in that probe's own test module.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import psutil
import pytest

from gpusched.core.models import GpuHealth, GpuState
from gpusched.gpus.probe import Probe, SimulatedProbe
from tests.daemon_harness import eventually
from tests.fakenvml.fixtures import FakeNvml

GiB = 2**30
SIZES = [24 * GiB, 16 * GiB]


@dataclass
class Kit:
    """A probe plus the way to make a process hold memory on its GPUs."""

    probe: Probe
    occupy: Callable[[int, Sequence[str], int], None]  # pid, gpu uuids, bytes per GPU


def _simulated() -> Kit:
    probe = SimulatedProbe(SIZES)
    return Kit(probe, probe.note_job_started)


def _nvml(fake: FakeNvml) -> Kit:
    from gpusched.gpus.nvml import NvmlProbe

    fake.set_gpus(SIZES)
    probe = NvmlProbe()

    def occupy(pid: int, uuids: Sequence[str], n_bytes: int) -> None:
        for uuid in uuids:  # what the job's CUDA context does on a real driver...
            fake.register_process(uuid, pid, n_bytes)
        probe.note_job_started(pid, uuids, n_bytes)  # ...and what the daemon tells the probe

    return Kit(probe, occupy)


@pytest.fixture(params=["simulated", "nvml-fake"])
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    if request.param == "simulated":
        made = _simulated()
    else:
        made = _nvml(request.getfixturevalue("fake_nvml_inproc"))
    yield made
    made.probe.close()


def by_uuid(states: list[GpuState]) -> dict[str, GpuState]:
    return {gpu.uuid: gpu for gpu in states}


def test_gpus_have_unique_uuids_and_indices_in_order(kit: Kit) -> None:
    gpus = kit.probe.snapshot()
    assert len(gpus) == len(SIZES)
    assert [g.index for g in gpus] == list(range(len(SIZES)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert all(g.uuid.startswith("GPU-") and g.name for g in gpus)
    assert [g.total_bytes for g in gpus] == SIZES
    assert all(g.health is GpuHealth.OK and g.error is None for g in gpus)


def test_memory_adds_up(kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]) -> None:
    gpus = kit.probe.snapshot()
    kit.occupy(spawn().pid, [gpus[0].uuid], 5 * GiB)
    for gpu in kit.probe.snapshot():
        assert gpu.used_bytes >= 0
        assert gpu.free_bytes >= 0
        assert gpu.used_bytes + gpu.free_bytes <= gpu.total_bytes
        # A driver's own reserve is small; nothing else may go missing.
        assert gpu.used_bytes + gpu.free_bytes >= gpu.total_bytes - GiB


def test_idle_gpus_list_no_processes(kit: Kit) -> None:
    for gpu in kit.probe.snapshot():
        assert gpu.processes == ()
        assert gpu.free_bytes > gpu.total_bytes - GiB


def test_a_process_memory_shows_on_its_gpu_only(
    kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    idle = kit.probe.snapshot()
    job = spawn()
    kit.occupy(job.pid, [idle[1].uuid], 3 * GiB)
    now = by_uuid(kit.probe.snapshot())
    gpu0, gpu1 = now[idle[0].uuid], now[idle[1].uuid]
    assert [(p.pid, p.used_bytes) for p in gpu1.processes] == [(job.pid, 3 * GiB)]
    assert gpu1.free_bytes == idle[1].free_bytes - 3 * GiB
    assert gpu1.used_bytes == idle[1].used_bytes + 3 * GiB
    assert gpu0.processes == ()
    assert gpu0.free_bytes == idle[0].free_bytes


def test_a_multi_gpu_process_shows_on_each_gpu(
    kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    idle = kit.probe.snapshot()
    job = spawn()
    kit.occupy(job.pid, [g.uuid for g in idle], 2 * GiB)
    for before, after in zip(idle, kit.probe.snapshot(), strict=True):
        assert [p.pid for p in after.processes] == [job.pid]
        assert after.free_bytes == before.free_bytes - 2 * GiB


def test_memory_is_released_when_the_process_exits(
    kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    idle = kit.probe.snapshot()
    job = spawn()
    kit.occupy(job.pid, [idle[0].uuid], 4 * GiB)
    assert kit.probe.snapshot()[0].free_bytes == idle[0].free_bytes - 4 * GiB
    job.kill()
    job.wait()
    gpu = kit.probe.snapshot()[0]
    assert gpu.processes == ()
    assert gpu.free_bytes == idle[0].free_bytes


def test_a_zombie_holds_no_memory(kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]) -> None:
    idle = kit.probe.snapshot()
    job = spawn()
    kit.occupy(job.pid, [idle[0].uuid], 4 * GiB)
    job.kill()  # not reaped yet: the pid exists, as a zombie, until job.wait()
    eventually(lambda: psutil.Process(job.pid).status() == psutil.STATUS_ZOMBIE, 5)
    gpu = kit.probe.snapshot()[0]
    assert gpu.processes == ()
    assert gpu.free_bytes == idle[0].free_bytes


def test_listed_processes_are_alive(kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]) -> None:
    uuids = [g.uuid for g in kit.probe.snapshot()]
    jobs = [spawn() for _ in range(3)]
    for job in jobs:
        kit.occupy(job.pid, uuids, GiB)
    jobs[1].kill()
    jobs[1].wait()
    listed = {p.pid for gpu in kit.probe.snapshot() for p in gpu.processes}
    assert listed == {jobs[0].pid, jobs[2].pid}
    for pid in listed:
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_utilization_is_a_percentage_or_unknown(
    kit: Kit, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    gpus = kit.probe.snapshot()
    kit.occupy(spawn().pid, [gpus[0].uuid], GiB)
    for gpu in kit.probe.snapshot():
        assert gpu.util_percent is None or 0 <= gpu.util_percent <= 100


def test_identity_is_stable_across_snapshots(kit: Kit) -> None:
    first, second = kit.probe.snapshot(), kit.probe.snapshot()
    assert [(g.index, g.uuid, g.name, g.total_bytes) for g in first] == [
        (g.index, g.uuid, g.name, g.total_bytes) for g in second
    ]


def test_describe_is_one_line(kit: Kit) -> None:
    kit.probe.snapshot()
    text = kit.probe.describe()
    assert text.strip()
    assert "\n" not in text


def test_close_twice_is_harmless(kit: Kit) -> None:
    kit.probe.snapshot()
    kit.probe.close()
    kit.probe.close()
