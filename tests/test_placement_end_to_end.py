"""Issue 24 item 2 end to end on the fake NVML driver: on a real H200 a 2G `gpusched run`
waited with 69G free behind a head that waited for a running job; a small job that
leaves the head its room once that job ends must start beside it (memory backfill)."""

from __future__ import annotations

from typing import Any

from tests.fakenvml.fixtures import FakeNvml
from tests.fakenvml.state import FakeGpu, fake_uuid
from tests.test_nvml_end_to_end import start

GiB = 2**30


def test_a_small_job_starts_beside_a_waiting_head_that_still_fits(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([FakeGpu(uuid=fake_uuid(0), total_bytes=80 * GiB)])
    daemon = start(daemon_factory, fake_nvml)
    hold = fake_nvml.gpujob_argv("--mem", "40G", "--hold", "60")
    big = daemon.submit("--mem", "40G", "--", *hold)
    daemon.wait_state(big, {"running"})
    head = daemon.submit("--mem", "60G", "--", "true")
    daemon.wait_reason(head, "GPU 0 kept for it: starts when job")
    small = daemon.submit("--mem", "2G", "--", *fake_nvml.gpujob_argv("--mem", "2G"))
    assert daemon.wait_state(small, {"done"})["gpu_indices"] == [0]
    assert daemon.show(head)["state"] == "queued"
