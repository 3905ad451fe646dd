"""End to end: how busy simulated GPUs read, and what the default `pack: contention`
makes of it. A simulated job reads light unless its environment says otherwise
(GPUSCHED_SIM_UTIL), so a try-out on `--simulate` shows jobs sharing a card.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gpusched.gpus.probe import SIM_UTIL_ENV, SimulatedProbe
from tests.daemon_harness import RunningDaemon, eventually

GiB = 2**30


def until(go: Path) -> list[str]:
    """One command for every run: at least 1.5 s (enough polls to measure its demand
    alone), then until the test creates `go`."""
    script = (
        "import os, time\nstart = time.monotonic()\n"
        f"while time.monotonic() - start < 1.5 or not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
    )
    return [sys.executable, "-c", script]


def with_history(daemon: RunningDaemon, command: list[str], go: Path, **kwargs: Any) -> float:
    """Run `command` once to its end, alone, and return the demand measured of it."""
    go.touch()
    first = daemon.submit("--mem", "4G", "--", *command, **kwargs)
    demand = daemon.wait_state(first, {"done"})["demand"]
    go.unlink()
    assert demand is not None, "no demand measured: the next runs would have no history"
    return float(demand)


def test_light_jobs_with_history_share_one_simulated_card(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(simulate="1x24G", config={"poll_interval": "0.3s"}).start()
    go = tmp_path / "go"
    command = until(go)
    assert with_history(daemon, command, go) < 0.5
    jobs = [daemon.submit("--mem", "4G", "--", *command) for _ in range(3)]
    eventually(
        lambda: all(daemon.show(j)["state"] == "running" for j in jobs),
        20,
        describe=lambda: [(daemon.show(j)["state"], daemon.show(j)["reason"]) for j in jobs],
    )
    go.touch()
    for job in jobs:
        assert daemon.wait_state(job, {"done"})["gpu_indices"] == [0]


def test_a_card_reads_the_sum_of_its_jobs_figures_at_most_100() -> None:
    probe = SimulatedProbe([24 * GiB, 24 * GiB])
    first, second = (gpu.uuid for gpu in probe.snapshot())
    me = os.getpid()
    probe.note_job_started(me, [first], GiB)  # the default: light
    probe.note_job_started(me, [first], GiB, {SIM_UTIL_ENV: "30"})
    probe.note_job_started(me, [second], GiB, {SIM_UTIL_ENV: "95"})
    probe.note_job_started(me, [second], GiB, {SIM_UTIL_ENV: "95%"})
    assert [gpu.util_percent for gpu in probe.snapshot()] == [40, 100]
    busy = SimulatedProbe([24 * GiB], util_percent=100)
    (only,) = (gpu.uuid for gpu in busy.snapshot())
    busy.note_job_started(me, [only], GiB, {SIM_UTIL_ENV: "lots"})  # not a figure: the default
    assert [gpu.util_percent for gpu in busy.snapshot()] == [100]


def test_busy_jobs_by_their_environment_wait_for_a_quieter_card(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory(simulate="1x24G", config={"poll_interval": "0.3s"}).start()
    go = tmp_path / "go"
    command = until(go)
    env = {**daemon.env, SIM_UTIL_ENV: "95"}
    assert with_history(daemon, command, go, env=env) >= 0.5
    running, waiting = (daemon.submit("--mem", "4G", "--", *command, env=env) for _ in range(2))
    daemon.wait_state(running, {"running"})
    daemon.wait_reason(waiting, "quieter")
    go.touch()
    assert daemon.wait_state(waiting, {"done"})["started_at"] >= daemon.show(running)["ended_at"]


def test_simulate_util_100_keeps_every_job_busy(daemon_factory: Any, tmp_path: Path) -> None:
    config = {"poll_interval": "0.3s", "simulate_util": 100}
    daemon = daemon_factory(simulate="1x24G", config=config).start()
    go = tmp_path / "go"
    command = until(go)
    assert with_history(daemon, command, go) == 1.0
    running, waiting = (daemon.submit("--mem", "4G", "--", *command) for _ in range(2))
    daemon.wait_state(running, {"running"})
    daemon.wait_reason(waiting, "quieter")
    go.touch()
    daemon.wait_state(waiting, {"done"})
