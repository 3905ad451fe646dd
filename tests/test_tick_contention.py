"""Rule 3 (issue 25's contention rule) one `Scheduler.tick()` at a time (tests/world.py):
each job's GPU demand comes from what was measured of its earlier runs (`--name`, sweep or
command: UsageMonitor.expected_demand), a busy job waits for a quieter card however long
it was queued before (its wait counted from the first pass that held it), and the card it
keeps for that is its own once its busy jobs end."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.models import JobState
from gpusched.store import NewJob
from gpusched.usage.monitor import HISTORY_TTL_S
from tests.fakes import GiB
from tests.world import World, make_cluster, make_world

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
    world.scheduler.store.usage.set_usage(earlier, demand=demand)
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


def test_a_busy_job_waits_for_a_quieter_card_counted_from_when_it_was_first_held(
    tmp_path: Path,
) -> None:
    """A busy job that sat in the queue (held) far longer than ten minutes still waits for
    a quieter card once it may start (it used to join a busy card at once: its wait was
    counted from its submit), and its reason counts the wait from the first pass that
    held it for one."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    assert sorted(g for job in running for g in world.gpus_of(job)) == [0, 1]
    late = world.submit(20 * GiB, name="busy")
    assert world.scheduler.store.jobs.hold(late)
    world.clock.advance(3 * 3600)  # long queued
    world.tick()
    assert world.scheduler.store.jobs.release(late)
    world.tick()
    assert world.state(late) == JobState.QUEUED
    why = world.job(late).waiting_reason or ""
    assert "waits for a quieter card" in why and "so far" not in why
    world.clock.advance(20 * 60)
    world.tick()
    assert world.state(late) == JobState.QUEUED  # no time limit makes it share
    why = world.job(late).waiting_reason or ""
    assert "for 20 min so far" in why  # not 3 h: counted from when it was first held


def test_the_card_kept_for_a_busy_job_takes_no_other_and_is_its_own_once_quiet(
    tmp_path: Path,
) -> None:
    """The bound: the held job keeps the card whose busy job ends first (by --time); a
    light job submitted after it starts elsewhere, not there; the busy job there ends and
    the held job starts on it."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    long = world.submit(20 * GiB, name="busy")
    short = world.submit(20 * GiB, name="busy", time_limit_s=1800)
    world.tick()
    assert sorted(world.gpus_of(long) + world.gpus_of(short)) == [0, 1]
    late = world.submit(20 * GiB, name="busy")
    world.tick()
    assert world.state(late) == JobState.QUEUED
    kept = world.gpus_of(short)[0]
    why = world.job(late).waiting_reason or ""
    assert f"GPU {kept} kept for it: starts when busy job {short} ends (by --time" in why
    light = world.submit(5 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == world.gpus_of(long)  # beside the other busy job
    world.clock.advance(1200)
    world.finish(short)
    world.tick()
    assert world.state(late) == JobState.RUNNING
    assert world.gpus_of(late) == [kept]


@pytest.mark.parametrize("placer", ["local", "cluster"])
def test_both_placers_feed_the_demand_and_hold_a_busy_job(tmp_path: Path, placer: str) -> None:
    """One server's placer and a cluster's elected scheduler alike (pass_rules.decide): the
    running jobs' demands as their measurement stored them, the waiting job's from its
    history; a third busy job waits for a quieter card."""
    sizes = [80 * GiB, 80 * GiB]
    world = (
        make_world(tmp_path, sizes)
        if placer == "local"
        else make_cluster(tmp_path, ["a"], sizes)[0]
    )
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    world.tick()
    assert sorted(g for job in running for g in world.gpus_of(job)) == [0, 1]
    for job in running:  # as the usage monitor's flush writes a running job's figures
        world.scheduler.store.usage.set_usage(job, demand=BUSY)
    world.clock.advance(HISTORY_TTL_S + 1)
    late = world.submit(20 * GiB, name="busy")
    world.tick()
    world.tick()
    assert world.state(late) == JobState.QUEUED
    assert "waits for a quieter card" in (world.job(late).waiting_reason or "")


def test_a_light_job_waits_for_a_card_that_stays_within_its_busy_time(tmp_path: Path) -> None:
    """Rule 3c for light jobs (pack25): history 30 %, both cards run a busy job (95 %):
    beside either it would pass 100 % and stretch both, so it waits, and its reason says
    so; once one busy job ends it starts on that card."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "medium", 0.3)
    busy = [world.submit(20 * GiB, name="busy"), world.submit(20 * GiB, name="busy")]
    world.tick()
    assert sorted(world.gpus_of(busy[0]) + world.gpus_of(busy[1])) == [0, 1]
    light = world.submit(5 * GiB, name="medium")
    world.tick()
    assert world.state(light) == JobState.QUEUED
    assert "no card stays within 100 % with it" in (world.job(light).waiting_reason or "")
    world.finish(busy[1])
    world.tick()
    assert world.gpus_of(light) == world.gpus_of(busy[1])


def test_new_jobs_of_unknown_demand_start_at_most_two_to_a_card_per_pass(
    tmp_path: Path,
) -> None:
    """Rule 3c for jobs with no history (pack25): counted busy once placed in a pass, a
    card with two of them is full for the rest of that pass, so a flood of a new script
    does not pile on the cards before a poll has measured any of it; the next pass (those
    running, not measured yet, count for nothing) starts more."""
    world = make_world(tmp_path, [24 * GiB] * 2)
    flood = [world.submit(2 * GiB, name="new") for _ in range(10)]
    world.tick()
    assert sum(world.state(j) == JobState.RUNNING for j in flood) == 4
    world.tick()
    assert sum(world.state(j) == JobState.RUNNING for j in flood) == 8
