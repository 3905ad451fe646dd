"""`show`'s expected start of a waiting job, one pass at a time with a fixed clock: known
only for the head with cards kept for it, when every running job on those cards has a
`--time` (the latest of their ends); unknown ("null") for any other waiting job, and
never promised where a job without `--time` stands in the way.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from gpusched.cli.show_view import show_json, show_lines
from gpusched.core.models import JobState
from tests.fakes import GiB
from tests.world import World, make_world

HOUR = 3600.0


def _expected(world: World, job_id: int) -> str | None:
    return world.scheduler.expected_start(world.job(job_id))


def test_the_head_starts_when_the_jobs_on_its_kept_card_run_out_of_time(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    # Light (--share): busy jobs whose --time sharing could break would not share a card.
    first = world.submit(12 * GiB, time_limit_s=HOUR, share=True)
    second = world.submit(8 * GiB, time_limit_s=2 * HOUR, share=True)
    world.tick()
    started = world.job(first).started_at
    assert started is not None and world.state(second) == JobState.RUNNING
    head = world.submit(20 * GiB)
    behind = world.submit(20 * GiB)
    world.tick()
    assert world.state(head) == JobState.QUEUED
    latest_end = datetime.fromisoformat(started) + timedelta(seconds=2 * HOUR)
    expected = _expected(world, head)
    assert expected is not None
    assert datetime.fromisoformat(expected) == latest_end
    assert _expected(world, behind) is None  # behind the head: not knowable
    assert world.job(head).to_json().get("expected_start") is None  # `show` adds it


def test_a_job_without_time_in_the_way_gives_no_promise(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    world.submit(12 * GiB, time_limit_s=HOUR)
    world.submit(8 * GiB)  # no --time: it may run for ever
    world.tick()
    head = world.submit(20 * GiB)
    world.tick()
    assert world.state(head) == JobState.QUEUED
    assert _expected(world, head) is None


def test_a_head_past_the_time_of_what_it_waits_for_is_expected_now(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    world.submit(20 * GiB, time_limit_s=60)
    world.tick()
    head = world.submit(20 * GiB)
    world.tick()
    world.clock.advance(120)  # its --time is past, its end not yet seen
    world.tick()
    assert world.state(head) == JobState.QUEUED
    expected = _expected(world, head)
    assert expected is not None
    assert datetime.fromisoformat(expected) == world.clock.now


def test_show_prints_it_and_its_json_adds_it() -> None:
    reply = {"id": 3, "user": "alice", "uid": 1000, "command": ["train.py"], "cwd": "/"}
    waiting = {**reply, "waiting_reason": "waiting for job 1"}
    known = show_lines({**waiting, "expected_start": "2026-01-05T11:00:00.000+00:00"}, 80)
    assert "expected start: 2026-01-05 11:00:00 UTC" in known
    assert "expected start: unknown" in show_lines({**waiting, "expected_start": None}, 80)
    assert not any("expected start" in line for line in show_lines(reply, 80))  # ran
    assert json.loads(show_json({**waiting, "expected_start": None}))["expected_start"] is None
