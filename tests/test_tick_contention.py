"""Rule 3 (issue 25's contention rule) one `Scheduler.tick()` at a time (tests/world.py):
each job's GPU demand comes from what was measured of its earlier runs (`--name`, sweep or
command: UsageMonitor.expected_demand), and the bound on waiting for a quieter card runs
from when the job was first held for one, not from its submit."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.models import JobState
from gpusched.scheduling.gpu_choice import CONTENTION_WAIT_S
from gpusched.store import NewJob
from gpusched.usage.monitor import HISTORY_TTL_S
from tests.fakes import GiB
from tests.world import World, make_world

BUSY = 0.95  # a compute-bound training loop (FIELD.md: 95-98 % alone)
LIGHT = 0.05  # a job that waits on data most of the time


def past_run(world: World, name: str, demand: float) -> None:
    """An earlier run of a job called `name` (another script) that was measured at
    `demand` and has ended: what the history of a job with that --name says."""
    earlier = world.scheduler.submit(
        NewJob(
            user="alice",
            uid=1000,
            gid=1000,
            command=["earlier.py"],
            cwd="/",
            env={},
            umask=0o022,
            mem=1 * GiB,
            name=name,
        )
    ).id
    world.tick()
    assert world.state(earlier) == JobState.RUNNING
    world.finish(earlier)
    world.tick()
    assert world.state(earlier) == JobState.DONE
    world.scheduler.store.set_usage(earlier, demand=demand)
    world.clock.advance(HISTORY_TTL_S + 1)  # the daemon reads the history once a minute


def test_two_busy_jobs_with_history_go_to_different_cards(tmp_path: Path) -> None:
    """Their history says both are busy, a light job runs on one card: each busy job
    takes a card of its own (one beside the light job), not both the roomier card."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    light = world.submit(30 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == [0]
    first = world.submit(20 * GiB, name="busy")
    second = world.submit(20 * GiB, name="busy")
    world.tick()
    assert world.state(first) == world.state(second) == JobState.RUNNING
    assert sorted(world.gpus_of(first) + world.gpus_of(second)) == [0, 1]


def test_a_light_job_goes_beside_a_busy_one(tmp_path: Path) -> None:
    """History ~5 %: it shares the busy job's card, not the roomier card whose job's
    demand is unknown (counted busy)."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    busy = world.submit(20 * GiB, name="busy")
    world.tick()
    unknown = world.submit(10 * GiB, name="new")
    world.tick()
    assert (world.gpus_of(busy), world.gpus_of(unknown)) == ([0], [1])
    light = world.submit(5 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == [0]


def test_the_bound_on_waiting_for_a_quieter_card_runs_from_when_it_was_first_held(
    tmp_path: Path,
) -> None:
    """A busy job that sat in the queue (held) far longer than the bound still waits for
    a quieter card once it may start, and joins a busy card only after the bound."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    assert sorted(g for job in running for g in world.gpus_of(job)) == [0, 1]
    late = world.submit(20 * GiB, name="busy")
    assert world.scheduler.store.hold(late)
    world.clock.advance(3 * CONTENTION_WAIT_S)  # long queued: older than the bound
    world.tick()
    assert world.scheduler.store.release(late)
    world.tick()
    assert world.state(late) == JobState.QUEUED
    why = world.job(late).waiting_reason or ""
    assert "quieter card" in why and "in at most 10 min" in why
    world.clock.advance(CONTENTION_WAIT_S - 60)
    world.tick()
    assert world.state(late) == JobState.QUEUED
    assert "in at most 1 min" in (world.job(late).waiting_reason or "")
    world.clock.advance(60)
    world.tick()
    assert world.state(late) == JobState.RUNNING  # the bound: it shares a busy card now


def test_a_card_that_frees_within_the_bound_takes_the_busy_job(tmp_path: Path) -> None:
    """Waiting pays: a busy card frees before the bound and the held job gets it alone."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    late = world.submit(20 * GiB, name="busy")
    world.tick()
    assert world.state(late) == JobState.QUEUED
    world.clock.advance(CONTENTION_WAIT_S / 2)
    world.finish(running[1])
    world.tick()
    assert world.state(late) == JobState.RUNNING
    assert world.gpus_of(late) == world.gpus_of(running[1])
