"""Placement that cannot be gamed or fooled, one `Scheduler.tick()` at a time
(tests/world.py): a job that needs a card to itself is not starved by a stream of small
jobs, what the daemon measured outranks what a job says of itself, memory another process
took is not blamed on the job it starved, and the waiting reasons say what is true."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpusched.core.models import JobState
from tests.fakes import GiB
from tests.world import World, make_world

# A small job of the stream runs this many passes (each a tick, 2 s) once started.
SMALL_RUNS = 4


def feed_until_started(
    world: World, head: int, smalls: list[int], passes: int = 40
) -> tuple[bool, list[str]]:
    """Run `passes` passes; each small job runs SMALL_RUNS passes and is then replaced by a
    new one (the first ones end one pass apart, so the card is never empty of them by
    chance). Whether `head` started, and its reason at each pass before."""
    started = {job: -k for k, job in enumerate(smalls)}
    reasons: list[str] = []
    for step in range(passes):
        for job in list(smalls):
            if world.state(job) != JobState.RUNNING:
                continue
            if step - started.setdefault(job, step) >= SMALL_RUNS:
                world.finish(job)
                smalls.remove(job)
                smalls.append(world.submit(2 * GiB))
        world.tick()
        if world.state(head) == JobState.RUNNING:
            return True, reasons
        reasons.append(world.job(head).waiting_reason or "")
    return False, reasons


@pytest.mark.parametrize(
    ("cards", "ask"),
    [
        (1, {"mem": 10 * GiB, "exclusive": True}),
        (2, {"mem": 4 * GiB, "gpus": 2, "exclusive": True}),
        (2, {"mem": None, "gpus": 2}),
    ],
    ids=["exclusive", "exclusive-two-gpus", "two-whole-gpus"],
)
def test_a_job_that_needs_a_card_to_itself_starts_behind_a_stream_of_small_jobs(
    tmp_path: Path, cards: int, ask: dict[str, Any]
) -> None:
    """Four 2G jobs a card kept running; the head's claim was sized by memory only, so
    each new small job started beside the `--exclusive` head, which never started while
    its reason said its card was kept for it."""
    world = make_world(tmp_path, [24 * GiB] * cards, pack="memory")
    smalls = [world.submit(2 * GiB) for _ in range(4 * cards)]
    world.tick()
    head = world.submit(**ask)
    started, reasons = feed_until_started(world, head, smalls)
    assert started, reasons[-1]
    # Its reason was true at every pass: it waits for the jobs on its cards to end.
    assert reasons
    assert all("kept for it: starts when" in r for r in reasons), reasons
    if ask.get("exclusive"):
        assert all("with --exclusive" in r for r in reasons)


def test_a_job_whose_time_ends_first_may_still_start_beside_an_exclusive_head(
    tmp_path: Path,
) -> None:
    """The backfill rule used for memory: a job whose `--time` ends before the head could
    start does not delay it."""
    world = make_world(tmp_path, [24 * GiB], pack="memory")
    first = world.submit(2 * GiB, time_limit_s=600)
    world.tick()
    head = world.submit(10 * GiB, exclusive=True)
    world.tick()
    quick, slow = world.submit(2 * GiB, time_limit_s=300), world.submit(2 * GiB)
    world.tick()
    assert world.state(head) == JobState.QUEUED
    assert world.state(quick) == JobState.RUNNING
    assert world.state(slow) == JobState.QUEUED
    world.tick()
    reason = world.job(head).waiting_reason or ""
    assert f"starts when jobs {first}, {quick} end (by --time" in reason
    world.finish(first)
    world.finish(quick)
    world.tick()
    assert world.state(head) == JobState.RUNNING
    assert world.state(slow) == JobState.QUEUED
