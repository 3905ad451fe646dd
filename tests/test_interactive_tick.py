"""Interactive jobs (`gpusched run`, claim()) one scheduling pass at a time.

The scheduler, store and policy are real, the GPUs and the launcher fakes (as in
tests/world.py); each job's client is a real process (`sleep`, or a shell that ignores
SIGTERM), since the daemon knows a client only by its pid and start time.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.models import JobState, StopIntent
from gpusched.processes.pidref import process_start_time
from tests.fakes import GiB
from tests.world import World, make_world

Spawn = Callable[[], subprocess.Popen[bytes]]


@pytest.fixture
def clients() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Client processes (killed and reaped after the test)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(list(argv or ("sleep", "60"))))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def interactive(world: World, client: subprocess.Popen[bytes], **spec: Any) -> int:
    spec.setdefault("mem", 8 * GiB)
    return world.submit(
        client_pid=client.pid, client_start_time=process_start_time(client.pid), **spec
    )


def test_an_interactive_job_is_placed_and_nothing_is_launched(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    world.probe.hold(4242, 0, 6 * GiB)
    client = clients()
    job = interactive(world, client)
    world.tick()
    placed = world.job(job)
    assert placed.state == JobState.RUNNING
    assert placed.interactive
    assert placed.gpu_indices == [1]  # placed as any job: the most available memory
    assert placed.pid == client.pid  # the root of its process tree, for the usage monitor
    assert placed.log_path is None
    assert world.launcher.started == []  # its client runs the command


def test_a_vanished_client_frees_its_gpu_within_one_pass(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    client = clients()
    job = interactive(world, client, mem=20 * GiB)
    world.tick()
    batch = world.submit(20 * GiB)
    world.tick()
    assert world.state(batch) == JobState.QUEUED  # the interactive job holds the card
    client.kill()
    client.wait()
    world.tick()
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.LOST, "lost")
    assert "ended without reporting" in (ended.reason_detail or "")
    assert world.state(batch) == JobState.RUNNING  # in the same pass


def test_a_client_gone_before_its_job_started_cancels_it(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    world.submit(20 * GiB)
    world.tick()
    client = clients()
    job = interactive(world, client, mem=20 * GiB)
    world.tick()
    assert world.state(job) == JobState.QUEUED
    client.kill()
    client.wait()
    world.tick()
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.CANCELLED, "cancelled")
    assert "exited before the job started" in (ended.reason_detail or "")


def test_the_clients_report_ends_the_job_with_its_exit_code_or_signal(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    exited, killed, fine = (interactive(world, clients(), mem=GiB) for _ in range(3))
    world.tick()
    world.tick()  # new jobs of unknown demand start at most two to a card per pass (rule 3c)
    scheduler = world.scheduler
    scheduler.interactive.finish(world.job(exited), 3, None)
    scheduler.interactive.finish(world.job(killed), None, signal.SIGKILL)
    scheduler.interactive.finish(world.job(fine), 0, None)
    assert (world.job(exited).state, world.job(exited).exit_code) == (JobState.FAILED, 3)
    assert (world.job(killed).reason, world.job(killed).exit_code) == ("signal", 137)
    assert "SIGKILL" in (world.job(killed).reason_detail or "")
    assert (world.job(fine).state, world.job(fine).reason) == (JobState.DONE, "exit")


def test_interactive_and_batch_jobs_share_a_card_without_overcommit(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    job = interactive(world, clients(), mem=10 * GiB)
    first, second = world.submit(10 * GiB), world.submit(10 * GiB)
    world.tick()
    world.tick()
    assert [world.state(j) for j in (job, first, second)] == [
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.QUEUED,
    ]
    assert "needs 10.0G" in (world.job(second).waiting_reason or "")


def test_each_user_runs_at_most_max_per_user_interactive_jobs(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB], interactive={"max_per_user": 1})
    first = interactive(world, clients(), mem=GiB)
    world.tick()
    second = interactive(world, clients(), mem=GiB)
    third = interactive(world, clients(), mem=GiB, priority=5)
    batch = world.submit(GiB)  # not interactive: not capped
    bobs = interactive(world, clients(), mem=GiB, user="bob")
    world.tick()
    assert world.state(first) == JobState.RUNNING
    assert world.state(batch) == JobState.RUNNING
    assert world.state(bobs) == JobState.RUNNING
    for waiting in (second, third):
        assert world.state(waiting) == JobState.QUEUED
        assert world.job(waiting).waiting_reason == (
            "interactive limit: alice has 1 running (interactive.max_per_user 1)"
        )
    world.scheduler.interactive.finish(world.job(first), 0, None)
    world.tick()
    assert world.state(third) == JobState.RUNNING  # the higher priority goes first
    assert world.state(second) == JobState.QUEUED


def test_two_waiting_under_the_cap_start_one_at_a_time(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB], interactive={"max_per_user": 1})
    blocker = world.submit(20 * GiB)
    world.tick()
    first = interactive(world, clients(), mem=10 * GiB)
    second = interactive(world, clients(), mem=GiB)
    world.tick()
    assert world.state(first) == JobState.QUEUED  # no room
    assert world.job(second).waiting_reason == (
        f"interactive limit: alice's interactive job {first} goes first"
        " (interactive.max_per_user 1)"
    )
    world.finish(blocker)
    world.tick()
    assert [world.state(first), world.state(second)] == [JobState.RUNNING, JobState.QUEUED]


def test_time_limit_asks_the_client_to_stop_then_ends_the_job_timeout(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    client = clients()
    job = interactive(world, client, mem=GiB, time_limit_s=60.0)
    world.tick()
    world.clock.advance(30)
    world.tick()
    assert client.poll() is None
    world.clock.advance(30)
    world.tick()
    assert world.scheduler.store.jobs.launch_info(job).stop_intent == StopIntent.TIMEOUT
    assert client.wait(timeout=10) == -signal.SIGTERM  # the client got SIGTERM
    world.tick()
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, "timeout")
    assert ended.reason_detail == "ran longer than its time limit of 1m"


def test_a_client_that_ignores_the_stop_is_killed_after_the_grace(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB], kill_grace="10s", poll_interval="2s")
    stubborn = clients("sh", "-c", "trap '' TERM; while :; do sleep 0.1; done")
    job = interactive(world, stubborn, mem=GiB, time_limit_s=60.0)
    world.tick()
    world.clock.advance(60)
    world.tick()  # asked to stop
    world.clock.advance(10)
    world.tick()
    assert stubborn.poll() is None  # ignores SIGTERM, and still within the grace + slack
    assert world.state(job) == JobState.RUNNING
    world.clock.advance(10)
    world.tick()  # kill_grace + 2 polls + 5 s after the request
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
    assert (world.job(job).state, world.job(job).reason) == (JobState.FAILED, "timeout")


def test_cancel_of_a_running_interactive_job_signals_its_client(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    client = clients()
    job = interactive(world, client, mem=GiB)
    world.tick()
    world.scheduler.cancel(world.job(job), by="alice")
    assert client.wait(timeout=10) == -signal.SIGTERM
    world.scheduler.interactive.finish(world.job(job), None, signal.SIGTERM)
    ended = world.job(job)
    assert (ended.state, ended.reason, ended.reason_detail) == (
        JobState.CANCELLED,
        "cancelled",
        "cancelled by alice",
    )


def test_an_idle_interactive_job_is_flagged_then_ended_if_configured(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB], interactive={"idle_timeout": "10m"})
    warned = interactive(world, clients(), mem=GiB)
    world.tick()
    world.clock.advance(9 * 60)
    world.tick()
    assert world.job(warned).warning is None
    world.clock.advance(60)
    world.tick()
    assert world.job(warned).warning == ("idle: no GPU use for 10m (interactive.idle_timeout 10m)")
    assert world.state(warned) == JobState.RUNNING  # on_idle: warn

    ending = make_world(
        tmp_path / "end", [24 * GiB], interactive={"idle_timeout": "10m", "on_idle": "end"}
    )
    client = clients()
    job = interactive(ending, client, mem=GiB)
    ending.tick()
    ending.clock.advance(10 * 60)
    ending.tick()
    assert client.wait(timeout=10) == -signal.SIGTERM
    ending.tick()
    ended = ending.job(job)
    assert (ended.state, ended.reason) == (JobState.CANCELLED, "idle")
    assert ended.reason_detail == "idle for 10m (interactive.idle_timeout)"


def test_a_job_using_its_gpu_is_not_idle(
    tmp_path: Path, clients: Callable[..., subprocess.Popen[bytes]]
) -> None:
    world = make_world(tmp_path, [24 * GiB], interactive={"idle_timeout": "1m"})
    client = clients()
    job = interactive(world, client, mem=4 * GiB)
    world.tick()
    world.probe.gpus[0] = world.probe.gpus[0].__class__(
        **{**world.probe.gpus[0].__dict__, "util_percent": 80}
    )
    world.probe.hold(client.pid, 0, 3 * GiB)  # the client itself allocated on its GPU
    for _ in range(40):
        world.clock.advance(5)
        world.tick()
    assert world.job(job).warning is None
    assert world.job(job).peak_mem == 3 * GiB  # measured as any job's
