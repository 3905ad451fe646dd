"""The fake driver reports device and per-process utilization apart, as a real card does.

FIELD.md ("What NVML showed", an H200 with driver 580): two busy loops sharing a card read
100 % on the device while each process reads its time slice (53-63 % on average), and a
process often has no sample at all in a poll (2-3 of 17 polls for a busy one, 13 of 17 for
a light one beside a busy one). gpusched's demand and hints are tested on these figures, so
the fake must be able to give them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from gpusched.gpus.nvml import NvmlProbe
from tests.fakenvml.fixtures import FakeNvml

GiB = 2**30


@pytest.fixture
def probe() -> Iterator[NvmlProbe]:
    made = NvmlProbe()
    yield made
    made.close()


def test_the_device_reads_busy_while_each_process_reads_its_slice(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    first, second = spawn(), spawn()
    fake_nvml_inproc.set_gpu(0, device_util_percent=100)
    fake_nvml_inproc.register_process(0, first.pid, GiB, sm_util=58)
    fake_nvml_inproc.register_process(0, second.pid, GiB, sm_util=55)
    gpu = probe.snapshot()[0]
    assert gpu.util_percent == 100  # not 58 + 55 capped, and not either process's figure
    assert probe.process_utilization()[gpu.uuid] == {first.pid: 58, second.pid: 55}
    fake_nvml_inproc.set_gpu(0, device_util_percent=None)  # back to the sum of the processes
    assert probe.snapshot()[0].util_percent == 100
    fake_nvml_inproc.set_gpu(0, device_util_percent=14)
    assert probe.snapshot()[0].util_percent == 14


def test_a_process_can_miss_its_sample_in_some_polls(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    busy, light = spawn(), spawn()
    fake_nvml_inproc.set_gpu(0, device_util_percent=99)
    fake_nvml_inproc.register_process(0, busy.pid, GiB, sm_util=88)
    fake_nvml_inproc.register_process(
        0, light.pid, GiB, sm_util=40, sample_every=3, sample_missing=2
    )
    uuid = probe.snapshot()[0].uuid
    polls = [probe.process_utilization()[uuid] for _ in range(9)]
    assert all(poll.get(busy.pid) == 88 for poll in polls)
    assert sum(light.pid in poll for poll in polls) == 3  # one poll in three, whatever the start
    fake_nvml_inproc.register_process(
        0, busy.pid, GiB, sm_util=58, sample_every=3, sample_missing=1
    )
    polls = [probe.process_utilization()[uuid] for _ in range(9)]
    assert sum(busy.pid in poll for poll in polls) == 6  # none in one poll of three


def test_a_poll_with_no_sample_at_all_is_empty_not_zero(
    fake_nvml_inproc: FakeNvml, probe: NvmlProbe, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    lone = spawn()
    fake_nvml_inproc.register_process(0, lone.pid, GiB, sm_util=3, sample_every=2, sample_missing=1)
    uuid = probe.snapshot()[0].uuid
    polls = [probe.process_utilization()[uuid] for _ in range(4)]
    assert sorted(len(poll) for poll in polls) == [0, 0, 1, 1]
    assert all(poll in ({}, {lone.pid: 3}) for poll in polls)
