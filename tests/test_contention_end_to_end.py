"""End to end on the fake NVML driver: a job's demand, what sharing cost it, and hints that
tell contention from starvation (issue 25).

The real daemon polls the fake driver (tests/fakenvml), which reports the device's
utilization apart from each process's and drops some per-process samples, as a real H200
did (FIELD.md, "What NVML showed": two busy loops sharing a card read 100 % on the device,
each process 53-63 % on average swinging 33-99 %, with no sample in 2-3 of 17 polls).
"""

from __future__ import annotations

from typing import Any

from tests.browser import chromium
from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml
from tests.test_usage_end_to_end import gpu_job, start, wait_all
from tests.test_web_browser import texts, web_daemon

GiB = 2**30
# A busy job's own figure while it takes turns with another busy one (FIELD.md), one value
# per 0.3 s; with --sample-every 6 --sample-missing 1 it has no sample in one poll of six.
TAKING_TURNS = (
    *("--util-cycle", "33,99,45,70,60,99,33,50,62,58", "--util-period", "0.3"),
    *("--sample-every", "6", "--sample-missing", "1"),
)


def _busy_pair(daemon: RunningDaemon, fake_nvml: FakeNvml) -> tuple[int, int]:
    job_args = ("--mem", "7G", *TAKING_TURNS, "--hold", "8")
    first = gpu_job(daemon, fake_nvml, "8G", *job_args)
    second = gpu_job(daemon, fake_nvml, "8G", *job_args)
    return first, second


def test_two_busy_jobs_sharing_a_card_are_told_of_contention_not_the_data_loader(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([24 * GiB])
    fake_nvml.set_gpu(0, device_util_percent=100)  # the card never idles while both run
    daemon = start(daemon_factory, fake_nvml)
    first, second = _busy_pair(daemon, fake_nvml)
    jobs = wait_all(daemon, [first, second])
    for job, other in ((first, second), (second, first)):
        shown = jobs[job]
        assert shown["state"] == "done"
        assert shown["gpu_indices"] == [0]
        assert not any("DataLoader" in hint for hint in shown["hints"]), shown["hints"]
        (hint,) = [h for h in shown["hints"] if "contention" in h]
        assert f"shared with job {other}" in hint
        assert "--exclusive" in hint
        assert shown["shared_with"] == [other]
        assert 0.3 < shown["sharing_speed"] < 0.8  # FIELD.md's C+C: 0.475x
        # It only ever ran sharing a saturated card and took its turn's worth: busy (its
        # half, recorded as its demand, would make its next run look half busy).
        assert shown["demand"] == 1.0
        text = daemon.cli("show", str(job)).stdout
        assert f"it shared GPU 0 with job {other}, also busy" in text
        assert "gpu demand:" in text


def test_a_job_alone_at_low_utilization_is_told_to_look_at_its_data_loading(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([24 * GiB])
    daemon = start(daemon_factory, fake_nvml)
    starved = gpu_job(daemon, fake_nvml, "8G", "--mem", "7G", *TAKING_TURNS, "--hold", "8")
    shown = wait_all(daemon, [starved])[starved]
    assert any("DataLoader num_workers" in hint for hint in shown["hints"]), shown["hints"]
    assert not any("contention" in hint for hint in shown["hints"])
    assert shown["shared_with"] == []
    assert shown["sharing_speed"] is None
    # Alone, the device's figure is its demand: about the mean of its cycle (59 %).
    assert 0.4 < shown["demand"] < 0.8


def test_the_dashboards_job_page_gives_the_demand_and_what_sharing_cost(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([24 * GiB])
    fake_nvml.set_gpu(0, device_util_percent=100)
    daemon, url = web_daemon(daemon_factory, fake_nvml, poll_interval="0.3s")
    first, second = _busy_pair(daemon, fake_nvml)
    shown = wait_all(daemon, [first, second])[first]
    with chromium() as driver:
        driver.get(f"{url}/job?id={first}")
        eventually(lambda: texts(driver, '#job-facts dd[data-fact="sharing"]'), 20)
        assert texts(driver, '#job-facts dd[data-fact="GPU demand"]') == [
            f"{shown['demand']:.2f} of a GPU's busy time"
        ]
        assert texts(driver, '#job-facts dd[data-fact="sharing"]') == [
            f"ran at about {shown['sharing_speed']:.1f}x: it shared GPU 0 with job {second},"
            " also busy"
        ]
