"""Idle detection on evidence (issue 27, item 10): gpusched.scheduling.idle_evidence, and
an interactive job's idle clock driven by it through `Scheduler.tick()`.

Before: where the driver gave no per-process sample the card's whole utilization stood
for the job's (an idle job on a card kept busy by others was never idle), an empty
sample table read as 0 % (a 3 %-busy job alone on its card read idle), and a 1 %
keep-alive kernel kept a job "active".
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpusched.core.models import GpuProcess, GpuState
from gpusched.scheduling.idle_evidence import Evidence, poll_evidence
from tests.fakes import GiB
from tests.test_interactive_tick import clients, interactive  # noqa: F401 (a fixture)
from tests.test_tick import make_world

JOB, OTHER = 100, 200


def _card(util: int | None, *pids: int) -> GpuState:
    processes = tuple(GpuProcess(pid, GiB) for pid in pids)
    return GpuState(0, "GPU-0", "fake", 24 * GiB, len(pids) * GiB, 0, util, processes=processes)


def _holding(*pids: int) -> dict[str, list[GpuProcess]]:
    return {"GPU-0": [GpuProcess(pid, GiB) for pid in pids]}


def test_the_cards_utilization_counts_only_for_a_job_alone_on_it() -> None:
    busy_neighbour = _card(90, JOB, OTHER)
    assert poll_evidence(_holding(JOB), [busy_neighbour], None) == Evidence.UNKNOWN
    assert poll_evidence(_holding(JOB), [_card(90, JOB)], None) == Evidence.BUSY
    assert poll_evidence(_holding(JOB), [_card(0, JOB)], None) == Evidence.QUIET


def test_a_missing_sample_is_not_idleness_where_nothing_was_sampled() -> None:
    """An empty table (nothing sampled on the card since the last poll) is no evidence
    that the job is idle: a 3 %-busy job alone on its card is busy by the card's figure."""
    assert poll_evidence(_holding(JOB), [_card(3, JOB)], {"GPU-0": {}}) == Evidence.BUSY
    shared = _card(3, JOB, OTHER)
    assert poll_evidence(_holding(JOB), [shared], {"GPU-0": {}}) == Evidence.UNKNOWN


def test_per_process_samples_decide_where_the_driver_gives_them() -> None:
    card = _card(90, JOB, OTHER)
    assert poll_evidence(_holding(JOB), [card], {"GPU-0": {JOB: 30, OTHER: 60}}) == Evidence.BUSY
    # Sampled per process there, the job without a sample or under the threshold: quiet.
    assert poll_evidence(_holding(JOB), [card], {"GPU-0": {OTHER: 90}}) == Evidence.QUIET
    assert poll_evidence(_holding(JOB), [card], {"GPU-0": {JOB: 1, OTHER: 89}}) == Evidence.QUIET
    assert poll_evidence({}, [card], None) == Evidence.QUIET  # no GPU memory held at all


def test_a_keep_alive_kernel_does_not_keep_a_job_from_being_idle(
    tmp_path: Path,
    clients: Callable[..., subprocess.Popen[bytes]],  # noqa: F811 (the fixture)
) -> None:
    world = make_world(tmp_path, [24 * GiB], interactive={"idle_timeout": "1m"})
    client = clients()
    job = interactive(world, client, mem=4 * GiB)
    world.tick()
    world.probe.gpus[0] = replace(world.probe.gpus[0], util_percent=1)  # a 1 % kernel
    world.probe.hold(client.pid, 0, 3 * GiB)
    for _ in range(14):
        world.clock.advance(5)
        world.tick()
    assert (world.job(job).warning or "").startswith("idle: no GPU use for")


def test_an_idle_job_on_a_shared_card_is_not_ended_without_evidence(
    tmp_path: Path,
    clients: Callable[..., subprocess.Popen[bytes]],  # noqa: F811 (the fixture)
) -> None:
    """A neighbour keeps the card at 80 % and the driver samples no process: the job's
    own use cannot be told, so it is neither idle nor busy on the card's figure."""
    world = make_world(tmp_path, [24 * GiB], interactive={"idle_timeout": "1m", "on_idle": "end"})
    client = clients()
    job = interactive(world, client, mem=4 * GiB)
    world.tick()
    world.probe.gpus[0] = replace(world.probe.gpus[0], util_percent=80)
    world.probe.hold(client.pid, 0, 3 * GiB)
    neighbour = subprocess.Popen(["sleep", "60"])
    try:
        world.probe.hold(neighbour.pid, 0, 8 * GiB)
        for _ in range(14):
            world.clock.advance(5)
            world.tick()
        assert world.job(job).warning is None
        assert world.state(job) == "running"
    finally:
        neighbour.kill()
        neighbour.wait()
