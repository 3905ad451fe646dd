"""The NVML probe on the fake driver, and the fake driver's own promises.

The shared probe contract is in test_probe_contract.py; here is what only NVML has: the
v2/v1 memory calls, old drivers without newer symbols, lost GPUs, no driver, no library.
Tests needing another build of the fake library, or none, run in a subprocess (one
libnvidia-ml.so.1 per process: see tests/fakenvml/fixtures.py).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.core.errors import GpuError
from gpusched.core.models import GpuHealth, GpuProcess
from gpusched.gpus.nvml import NvmlProbe
from tests.daemon_harness import eventually
from tests.fakenvml import state as fakestate
from tests.fakenvml.fixtures import FakeNvml

GiB = 2**30
MiB = 2**20
RESERVED = fakestate.DEFAULT_RESERVED_BYTES

# Prints each GPU of an NvmlProbe snapshot as JSON, or the GpuError's message.
SNAPSHOT_SCRIPT = """
import json, sys
from gpusched.core.errors import GpuError
from gpusched.gpus.nvml import NvmlProbe
probe = NvmlProbe()
try:
    gpus = probe.snapshot()
except GpuError as exc:
    print(json.dumps({"error": exc.message}))
    sys.exit(0)
print(json.dumps({"gpus": [
    {"uuid": g.uuid, "health": str(g.health), "total": g.total_bytes, "used": g.used_bytes,
     "free": g.free_bytes, "pids": {str(p.pid): p.used_bytes for p in g.processes}}
    for g in gpus]}))
"""


def run_snapshot(fake: FakeNvml, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", SNAPSHOT_SCRIPT],
        env=env or fake.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def probe() -> Iterator[NvmlProbe]:
    made = NvmlProbe()
    yield made
    made.close()


# ---- memory ----


def test_memory_v2_leaves_the_driver_reserve_out_of_used(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    fake_nvml_inproc.set_gpu(0, other_bytes=2 * GiB)
    fake_nvml_inproc.register_process(0, spawn().pid, 3 * GiB)
    gpu = probe.snapshot()[0]
    assert gpu.used_bytes == 5 * GiB
    assert gpu.free_bytes == 24 * GiB - 5 * GiB - RESERVED


def test_memory_v1_fallback_counts_the_reserve_as_used(
    fake_nvml_no_v2: FakeNvml, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    fake_nvml_no_v2.set_gpu(0, other_bytes=2 * GiB)
    fake_nvml_no_v2.register_process(0, spawn().pid, 3 * GiB)
    gpu = run_snapshot(fake_nvml_no_v2)["gpus"][0]
    assert gpu["health"] == "ok"
    assert gpu["used"] == 5 * GiB + RESERVED
    assert gpu["free"] == 24 * GiB - 5 * GiB - RESERVED  # the same free memory as with v2


def test_missing_v2_symbol_is_function_not_found_and_asked_once(fake_nvml_no_v2: FakeNvml) -> None:
    # Count the v2 attempts by wrapping the binding (pynvml, not gpusched) in the subprocess.
    code = """
import pynvml
from gpusched.gpus.nvml import NvmlProbe
real, v2_calls = pynvml.nvmlDeviceGetMemoryInfo, []
def counting(handle, version=None):
    if version:
        v2_calls.append(version)
    return real(handle, version=version)
pynvml.nvmlDeviceGetMemoryInfo = counting
probe = NvmlProbe()
for _ in range(3):
    assert all(g.health == "ok" for g in probe.snapshot())
try:
    real(pynvml.nvmlDeviceGetHandleByIndex(0), version=pynvml.nvmlMemory_v2)
except pynvml.NVMLError_FunctionNotFound:
    print("FunctionNotFound", len(v2_calls))
"""
    done = fake_nvml_no_v2.run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["FunctionNotFound", "1"]


def test_old_driver_without_v3_process_lists_still_lists_processes(
    fake_nvml_old: FakeNvml, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn()
    fake_nvml_old.register_process(1, job.pid, 2 * GiB)
    fake_nvml_old.register_process(1, os.getpid(), GiB, kind="graphics")
    gpus = run_snapshot(fake_nvml_old)["gpus"]
    assert gpus[1]["pids"] == {str(job.pid): 2 * GiB, str(os.getpid()): GiB}
    assert gpus[0]["pids"] == {}


# ---- processes ----


def test_unknown_process_memory_is_none_but_counts_in_used(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn()
    fake_nvml_inproc.register_process(0, job.pid, 6 * GiB, reported=False)
    gpu = probe.snapshot()[0]
    assert gpu.processes == (GpuProcess(job.pid, None),)
    assert gpu.used_bytes == 6 * GiB


def test_compute_and_graphics_processes_are_merged_by_pid(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    both, graphics = spawn(), spawn()
    fake_nvml_inproc.register_process(0, both.pid, 3 * GiB, kind="both")
    fake_nvml_inproc.register_process(0, graphics.pid, GiB, kind="graphics")
    gpu = probe.snapshot()[0]
    assert sorted(gpu.processes, key=lambda p: p.pid) == sorted(
        [GpuProcess(both.pid, 3 * GiB), GpuProcess(graphics.pid, GiB)], key=lambda p: p.pid
    )
    assert gpu.used_bytes == 4 * GiB


def test_a_reused_pid_is_not_the_registered_process(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn()
    fake_nvml_inproc.register_process(0, job.pid, GiB)
    assert probe.snapshot()[0].processes == (GpuProcess(job.pid, GiB),)
    # Pretend the registered process started at another time: the pid now names someone
    # else. Written raw, since the state module's writers drop such entries themselves.
    state = fake_nvml_inproc.read()
    process = state.gpus[0].processes[0]
    assert process.start_ticks is not None
    process.start_ticks -= 1
    fake_nvml_inproc.state_path.write_text(fakestate.dumps(state))
    gpu = probe.snapshot()[0]
    assert gpu.processes == ()
    assert gpu.used_bytes == 0


def test_utilization_adds_process_samples_and_can_be_unsupported(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn()
    fake_nvml_inproc.set_gpu(0, util_percent=30)
    fake_nvml_inproc.set_gpu(1, util_percent=None)
    fake_nvml_inproc.register_process(0, job.pid, GiB, sm_util=45)
    gpus = probe.snapshot()
    assert gpus[0].util_percent == 75
    assert gpus[1].util_percent is None
    uuid = gpus[0].uuid
    assert probe.process_utilization() == {uuid: {job.pid: 45}, gpus[1].uuid: {}}


# ---- lost GPUs ----


def test_a_lost_gpu_keeps_its_identity_and_recovers(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    before = probe.snapshot()
    fake_nvml_inproc.set_gpu(1, lost=True)
    during = probe.snapshot()
    assert during[0] == before[0]
    lost = during[1]
    assert lost.health is GpuHealth.LOST
    assert "GPU is lost" in (lost.error or "")
    assert (lost.index, lost.uuid, lost.name, lost.total_bytes) == (
        1,
        before[1].uuid,
        before[1].name,
        before[1].total_bytes,
    )
    assert lost.free_bytes == 0
    fake_nvml_inproc.set_gpu(1, lost=False)
    assert probe.snapshot() == before


def test_a_gpu_lost_before_the_first_read_gets_a_placeholder(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    fake_nvml_inproc.set_gpu(0, lost=True)
    gpus = probe.snapshot()
    assert gpus[0].health is GpuHealth.LOST
    assert gpus[0].free_bytes == 0
    assert gpus[0].uuid != gpus[1].uuid
    fake_nvml_inproc.set_gpu(0, lost=False)
    assert probe.snapshot()[0].uuid == fakestate.fake_uuid(0)


def test_a_failing_device_count_reports_known_gpus_as_lost(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    before = probe.snapshot()
    saved = fake_nvml_inproc.state_path.read_text()
    fake_nvml_inproc.state_path.unlink()  # the fake driver now fails every query
    gpus = probe.snapshot()
    assert [(g.uuid, g.health) for g in gpus] == [(g.uuid, GpuHealth.LOST) for g in before]
    assert all(g.error for g in gpus)
    fake_nvml_inproc.state_path.write_text(saved)
    assert probe.snapshot() == before


def test_a_gpu_that_leaves_the_count_is_reported_lost(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    before = probe.snapshot()
    fake_nvml_inproc.set_gpus([24 * GiB])
    gpus = probe.snapshot()
    assert [(g.uuid, g.health) for g in gpus] == [
        (before[0].uuid, GpuHealth.OK),
        (before[1].uuid, GpuHealth.LOST),
    ]


# ---- no driver, no library ----


def test_no_driver_is_one_gpu_error_naming_the_fix(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    fake_nvml_inproc.set_driver(loaded=False)
    with pytest.raises(GpuError) as caught:
        probe.snapshot()
    message = caught.value.message
    assert "driver is not loaded" in message
    assert "--simulate" in message
    assert "\n" not in message
    fake_nvml_inproc.set_driver(loaded=True)  # initialisation is retried: the driver came back
    assert len(probe.snapshot()) == 2


def test_other_init_errors_name_their_cause(fake_nvml_inproc: FakeNvml, probe: NvmlProbe) -> None:
    fake_nvml_inproc.set_driver(init_error=4)  # NVML_ERROR_NO_PERMISSION
    with pytest.raises(GpuError, match=r"permission.*/dev/nvidia.*--simulate"):
        probe.snapshot()
    assert "unavailable" in probe.describe()


def test_no_driver_in_a_fresh_process(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_driver(loaded=False)
    error = run_snapshot(fake_nvml)["error"]
    assert "driver is not loaded" in error
    assert "gpusched daemon --simulate" in error


def test_no_library_is_a_gpu_error(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    env = fake_nvml.env()
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # an empty directory
    error = run_snapshot(fake_nvml, env=env)["error"]
    assert "libnvidia-ml.so.1 not found" in error
    assert "--simulate" in error


# ---- the state file and the fake job ----


def test_concurrent_writers_lose_no_update_and_readers_see_whole_files(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    writer = """
import os, sys
from tests.fakenvml.state import register_process
path = os.environ["FAKENVML_STATE"]
for step in range(1, 16):
    for gpu in (0, 1):
        register_process(path, gpu, os.getpid(), step * 2**20)
sys.stdin.read()  # stay alive (the driver lists live processes only) until told to go
"""
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", writer],
            env=fake_nvml_inproc.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    try:
        deadline = time.monotonic() + 20
        while True:  # read through the storm: every snapshot sees two whole GPUs
            gpus = probe.snapshot()
            assert [g.health for g in gpus] == [GpuHealth.OK, GpuHealth.OK]
            expected = {(w.pid, 15 * MiB) for w in writers}
            if all({(p.pid, p.used_bytes) for p in g.processes} == expected for g in gpus):
                break
            assert time.monotonic() < deadline, f"updates lost: {fake_nvml_inproc.read()}"
            time.sleep(0.02)
    finally:
        for w in writers:
            w.communicate(b"", timeout=10)
    assert probe.snapshot()[0].processes == ()


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    eventually(condition, timeout, interval=0.02)


def test_gpujob_allocates_after_its_lag_and_frees_on_exit(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    env = {**fake_nvml_inproc.env(), "CUDA_VISIBLE_DEVICES": "1"}
    job = subprocess.Popen(
        fake_nvml_inproc.gpujob_argv("--lag", "0.5", "--mem", "3G", "--hold", "1", "--util", "60"),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert [g.processes for g in probe.snapshot()] == [(), ()]  # still in its lag
    wait_for(lambda: bool(probe.snapshot()[1].processes))
    gpus = probe.snapshot()
    assert gpus[1].processes == (GpuProcess(job.pid, 3 * GiB),)
    assert gpus[1].util_percent == 60
    assert gpus[0].processes == ()
    out, _ = job.communicate(timeout=10)
    assert job.returncode == 0
    assert f"allocated {3 * GiB} bytes on GPU 1" in out
    assert [g.processes for g in probe.snapshot()] == [(), ()]


def test_gpujob_child_holds_the_memory_and_exit_code_passes_through(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    uuids = [g.uuid for g in probe.snapshot()]
    env = {**fake_nvml_inproc.env(), "CUDA_VISIBLE_DEVICES": ",".join(reversed(uuids))}
    argv = ["--mem", "1G", "--hold", "1", "--child", "--grow", "2G", "--grow-after", "0.3"]
    job = subprocess.Popen(
        fake_nvml_inproc.gpujob_argv(*argv, "--exit-code", "3"), env=env, stdout=subprocess.PIPE
    )
    wait_for(lambda: all(g.processes for g in probe.snapshot()))
    holder = probe.snapshot()[0].processes[0].pid
    assert holder != job.pid
    assert psutil.Process(holder).ppid() == job.pid
    wait_for(lambda: probe.snapshot()[0].processes[0].used_bytes == 2 * GiB)
    assert probe.snapshot()[1].processes == (GpuProcess(holder, 2 * GiB),)
    job.communicate(timeout=10)
    assert job.returncode == 3


def test_gpujob_refuses_a_device_that_does_not_exist(fake_nvml: FakeNvml) -> None:
    env = {**fake_nvml.env(), "CUDA_VISIBLE_DEVICES": "0,7"}
    done = subprocess.run(
        fake_nvml.gpujob_argv("--mem", "1G"), env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "no GPU '7'" in done.stderr
    assert fake_nvml.read().gpus[0].processes == []


# ---- topology ----


def test_topology_reads_which_gpus_share_a_pcie_switch(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    gpus = fakestate.make_gpus([24 * GiB] * 4)
    for gpu, switch in zip(gpus, [0, 0, 1, 1], strict=True):
        gpu.switch = switch
    fake_nvml_inproc.set_gpus(gpus)
    levels = probe.topology()
    uuid = [g.uuid for g in gpus]
    assert levels[uuid[0]][uuid[1]] == levels[uuid[2]][uuid[3]] == 10  # NVML_TOPOLOGY_SINGLE
    assert levels[uuid[1]][uuid[2]] == 30  # NVML_TOPOLOGY_HOSTBRIDGE
    assert uuid[0] not in levels[uuid[0]]


def test_topology_a_driver_cannot_tell_is_left_out(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    fake_nvml_inproc.set_gpus([24 * GiB] * 2)  # no switch= on either: NOT_SUPPORTED
    assert probe.topology() == {}


# ---- device nodes ----


def test_device_minors_are_nvml_s_minor_numbers_not_indices(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    gpus = fakestate.make_gpus([24 * GiB] * 3)
    gpus[0].minor, gpus[1].minor = 4, 0  # the third keeps its index, as the default
    fake_nvml_inproc.set_gpus(gpus)
    probe.snapshot()
    assert probe.device_minors() == {gpus[0].uuid: 4, gpus[1].uuid: 0, gpus[2].uuid: 2}


def test_a_card_lost_before_its_minor_was_read_is_left_out(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe
) -> None:
    gpus = fakestate.make_gpus([24 * GiB] * 2)
    fake_nvml_inproc.set_gpus(gpus)
    probe.snapshot()
    fake_nvml_inproc.set_gpu(1, lost=True)
    assert probe.device_minors() == {gpus[0].uuid: 0}
    fake_nvml_inproc.set_gpu(1, lost=False)
    assert probe.device_minors() == {gpus[0].uuid: 0, gpus[1].uuid: 1}  # asked again
