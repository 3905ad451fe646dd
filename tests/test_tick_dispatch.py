"""What the job-end -> next-start path may skip reading, and that it still sees everything
(issue 30: the daemon's work per job).

A start takes its job out of the memo of the last queue read instead of reading the queue
again (store.jobs.left_queue), which holds only while nothing else changed the queue; a
pass skips reading the interactive jobs while it knows of none (scheduling.interactive).
The scheduler, store and policy are real, the GPUs and the launcher fakes (tests/world.py);
the interactive jobs' clients are real processes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from gpusched.core.models import JobState
from gpusched.processes.pidref import process_start_time
from gpusched.store import NewJob, Store
from tests.fakes import FixedClock, GiB
from tests.world import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path, [24 * GiB])  # one slot: one 20 GiB job at a time


@pytest.fixture
def client() -> Iterator[subprocess.Popen[bytes]]:
    """An interactive job's client process (killed and reaped after the test)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _interactive(client: subprocess.Popen[bytes]) -> NewJob:
    return NewJob(
        user="alice",
        uid=1000,
        gid=1000,
        command=["python"],
        cwd="/",
        env={},
        umask=0o022,
        mem=20 * GiB,
        client_pid=client.pid,
        client_start_time=process_start_time(client.pid),
    )


def _gone(client: subprocess.Popen[bytes]) -> None:
    client.kill()
    client.wait()


def test_back_to_back_jobs_start_in_order_one_per_end(world: World) -> None:
    jobs = [world.submit(20 * GiB) for _ in range(4)]
    world.tick()
    for n, job in enumerate(jobs):
        assert [world.state(j) for j in jobs[n:]] == [JobState.RUNNING] + [JobState.QUEUED] * (
            len(jobs) - n - 1
        )
        world.finish(job)
        world.tick()
        assert world.state(job) == JobState.DONE
    assert world.launcher.started == jobs


def test_a_job_submitted_after_a_start_is_seen_by_the_next_pass(world: World) -> None:
    first = world.submit(20 * GiB)
    world.tick()
    later = world.submit(20 * GiB)
    world.finish(first)
    world.tick()
    assert world.state(later) == JobState.RUNNING


def test_a_start_that_failed_for_now_is_queued_and_started_by_a_later_pass(
    world: World,
) -> None:
    again = world.submit(20 * GiB)
    world.launcher.busy.add(again)
    world.tick()
    assert world.state(again) == JobState.QUEUED  # back in the queue, not in the memo only
    world.tick()
    assert world.state(again) == JobState.RUNNING


class _WriteFirst:
    """The starter's clock: the first time a start asks it the time (after the pass read
    the queue, before the start's write), another writer changes the queue."""

    def __init__(self, clock: FixedClock, write: Callable[[], object]) -> None:
        self.clock, self.write = clock, write

    def __call__(self) -> datetime:
        write, self.write = self.write, lambda: None
        write()
        return self.clock()

    def monotonic(self) -> float:
        return self.clock.monotonic()


def test_a_queue_change_by_another_writer_during_a_pass_is_read_by_the_next(
    world: World,
) -> None:
    """Another connection (another node's daemon, say) raises a queued job's priority
    between the pass's queue read and its start's write: the start takes its job out of
    what that read found, but the next pass must read the queue again all the same."""
    first, second, third = (world.submit(20 * GiB) for _ in range(3))
    other = Store(world.scheduler.context.config.database_url)
    try:
        world.scheduler.starter.clock = _WriteFirst(
            world.clock, lambda: other.jobs.set_priority(third, 10)
        )
        world.tick()
    finally:
        other.close()
    assert world.state(first) == JobState.RUNNING
    world.finish(first)
    world.tick()
    assert (world.state(second), world.state(third)) == (JobState.QUEUED, JobState.RUNNING)


def test_a_running_interactive_jobs_gone_client_is_noticed_after_passes_with_none(
    world: World, client: subprocess.Popen[bytes]
) -> None:
    batch = world.submit(20 * GiB)
    for _ in range(3):  # passes that find no interactive job
        world.tick()
    world.finish(batch)
    job = world.scheduler.submit(_interactive(client)).id
    world.tick()
    assert world.state(job) == JobState.RUNNING
    world.tick()  # its client is alive: it keeps running
    assert world.state(job) == JobState.RUNNING
    _gone(client)
    world.tick()
    assert (world.state(job), world.job(job).reason) == (JobState.LOST, "lost")
    later = world.submit(20 * GiB)
    world.tick()
    assert world.state(later) == JobState.RUNNING  # and passes go on as before


def test_a_waiting_interactive_jobs_gone_client_is_noticed_after_passes_with_none(
    world: World, client: subprocess.Popen[bytes]
) -> None:
    world.submit(20 * GiB)  # holds the card
    world.tick()
    world.tick()
    job = world.scheduler.submit(_interactive(client)).id
    _gone(client)  # before any pass saw the job
    world.tick()
    assert (world.state(job), world.job(job).reason) == (JobState.CANCELLED, "cancelled")


def test_an_interactive_job_already_in_the_database_at_start_is_checked(
    world: World, client: subprocess.Popen[bytes]
) -> None:
    """A daemon's first pass knows nothing of the jobs a previous daemon queued: it reads."""
    job = world.scheduler.store.jobs.add(_interactive(client), world.clock().isoformat()).id
    _gone(client)
    world.tick()
    assert world.state(job) == JobState.CANCELLED
