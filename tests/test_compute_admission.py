"""Compute-aware admission (`busy_util`, policy rule 6) end to end on the fake NVML driver.

The daemon reads each GPU's utilization and each job's processes' SM utilization through
nvidia-ml-py from the fake driver; the tests set them in the driver's state file while
the daemon runs and check where (and whether) jobs start.
"""

from __future__ import annotations

from typing import Any

from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml
from tests.fakenvml.state import FakeGpu, fake_uuid

GiB = 2**30


def start(daemon_factory: Any, fake: FakeNvml, **config: Any) -> RunningDaemon:
    settings = {"poll_interval": "0.3s", **config}
    return daemon_factory(simulate=None, config=settings, env=fake.env()).start()


NOT_YET_JUDGED = "waiting for the next scheduling pass"


def waiting_reason(daemon: RunningDaemon, job_id: int) -> str:
    """The queued job's reason, once a scheduling pass has given it one."""

    def reason() -> str | None:
        job = daemon.client().job(job_id)
        assert job.state == "queued", job
        # Before its first pass a job reads "waiting for the next scheduling pass".
        return None if job.waiting_reason == NOT_YET_JUDGED else job.waiting_reason

    return str(eventually(reason))


def busy_card_and_idle_card(fake: FakeNvml) -> None:
    """GPU 0 has the most free memory but someone else's process keeps it 100 % busy."""
    fake.set_gpus(
        [
            FakeGpu(uuid=fake_uuid(0), util_percent=100),
            FakeGpu(uuid=fake_uuid(1), other_bytes=8 * GiB, util_percent=0),
        ]
    )


def test_without_busy_util_memory_alone_decides(daemon_factory: Any, fake_nvml: FakeNvml) -> None:
    busy_card_and_idle_card(fake_nvml)
    daemon = start(daemon_factory, fake_nvml)
    job = daemon.submit("--mem", "4G", "--", "sleep", "30")
    assert daemon.wait_state(job, {"running"})["gpu_indices"] == [0]


def test_a_saturated_gpu_takes_no_new_job_until_it_has_compute_to_spare(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    busy_card_and_idle_card(fake_nvml)
    daemon = start(daemon_factory, fake_nvml, busy_util="90%")
    first = daemon.submit("--mem", "4G", "--", "sleep", "60")
    assert daemon.wait_state(first, {"running"})["gpu_indices"] == [1]

    # `sleep` never touches its GPU, so it counts as a whole GPU's compute: GPU 1 is busy
    # now, and GPU 0 still is. The next job waits and says why.
    second = daemon.submit("--mem", "4G", "--", "sleep", "60")
    reason = waiting_reason(daemon, second)
    assert "busy" in reason and "GPU 0 at 100 %" in reason and "GPU 1 at 100 %" in reason, reason
    assert "busy_util 90 %" in reason

    # The other process on GPU 0 goes quiet: once the recent utilization falls below 90 %,
    # the job starts there.
    fake_nvml.set_gpu(0, util_percent=0)
    assert daemon.wait_state(second, {"running"})["gpu_indices"] == [0]


def test_a_job_measured_below_the_threshold_leaves_room_for_another(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([FakeGpu(uuid=fake_uuid(0), util_percent=0)])
    daemon = start(daemon_factory, fake_nvml, busy_util="90%")
    light = fake_nvml.gpujob_argv("--lag", "3", "--mem", "2G", "--hold", "60", "--util", "30")
    first = daemon.submit("--mem", "4G", "--", *light)
    daemon.wait_state(first, {"running"})
    second = daemon.submit("--mem", "4G", "--", "sleep", "60")
    # Until the first job shows its 30 %, it counts as 100 %: the second one waits...
    assert "busy" in waiting_reason(daemon, second)
    # ...and starts beside it once it has been measured.
    assert daemon.wait_state(second, {"running"}, timeout=20)["gpu_indices"] == [0]
