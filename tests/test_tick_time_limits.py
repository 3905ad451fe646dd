"""A job's `--time` kept under packing, one `Scheduler.tick()` at a time on a fixed clock
(tests/world.py): a user's `--time` is a promise about the job alone, so gpusched does
not place a job where sharing would slow it, or a job with a `--time` already on the
card, past its limit (policy module time_limits); jobs without `--time`, and light ones,
still go by the default rule. Demands come from earlier runs' history
(tests/test_tick_contention.py `past_run`); a job with none counts as busy."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.models import JobState
from tests.fakes import GiB
from tests.test_tick_contention import LIGHT, past_run
from tests.world import make_world


def test_a_job_with_time_does_not_start_where_sharing_would_slow_it_past_its_limit(
    tmp_path: Path,
) -> None:
    """Two jobs of unknown demand (counted busy) with `--time`: sharing a card would run
    each at about half speed and get both killed at their limit, so the second waits for
    the card, and starts once the first ends."""
    world = make_world(tmp_path, [80 * GiB])
    first = world.submit(10 * GiB, time_limit_s=600)
    world.tick()
    assert world.state(first) == JobState.RUNNING
    second = world.submit(10 * GiB, time_limit_s=600)
    world.tick()
    assert world.state(second) == JobState.QUEUED
    why = world.job(second).waiting_reason or ""
    assert "sharing would slow it to about 48% of its speed alone, past its --time of 10m" in why
    assert f"GPU 0 kept for it: starts when busy job {first} ends" in why, why
    world.finish(first)
    world.tick()
    assert world.state(second) == JobState.RUNNING


def test_a_job_does_not_start_where_it_would_slow_a_running_job_past_its_limit(
    tmp_path: Path,
) -> None:
    """The running job has a `--time`, the new one none: placing it there would slow
    the running one, whose remaining time is taken to be all it needs at its speed now."""
    world = make_world(tmp_path, [80 * GiB])
    timed = world.submit(10 * GiB, time_limit_s=3600)
    world.tick()
    untimed = world.submit(10 * GiB)
    world.tick()
    assert world.state(untimed) == JobState.QUEUED
    why = world.job(untimed).waiting_reason or ""
    assert f"would slow job {timed} past its --time" in why, why


def test_light_jobs_with_time_go_by_most_free_memory(tmp_path: Path) -> None:
    """What stays within one card's busy time slows nobody: light jobs with `--time` pack
    by the default rule (the most free memory once declared needs are counted)."""
    world = make_world(tmp_path, [80 * GiB, 40 * GiB])
    past_run(world, "light", LIGHT)
    light = [world.submit(10 * GiB, name="light", time_limit_s=600) for _ in range(4)]
    world.tick()
    assert [world.state(j) for j in light] == [JobState.RUNNING] * 4
    assert [world.gpus_of(j) for j in light] == [[0], [0], [0], [0]]  # 70G, 60G, 50G free
