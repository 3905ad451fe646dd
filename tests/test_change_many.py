"""Holding, releasing and setting the priority of many jobs is one transaction and one
scheduling pass (scheduling.waiting_ops `change_many`, the `change` request), not one of
each per job: 40 held jobs released one request each took 1.1-20.8 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.models import JobState
from gpusched.store.engine import commits_sent
from tests.fakes import GiB
from tests.world import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    wakes: list[int] = []
    made = make_world(tmp_path, [80 * GiB], wake=lambda: wakes.append(1))
    made.wakes = wakes  # type: ignore[attr-defined]
    return made


@pytest.mark.parametrize(
    ("action", "before", "after"),
    [
        ("release", JobState.HELD, JobState.QUEUED),
        ("hold", JobState.QUEUED, JobState.HELD),
    ],
)
def test_forty_jobs_change_in_one_transaction(
    world: World, action: str, before: JobState, after: JobState
) -> None:
    ids = [world.submit(held=before == JobState.HELD) for _ in range(40)]
    jobs = [world.scheduler.store.jobs.get(i) for i in ids]
    assert {j.state for j in jobs} == {before}
    wakes_before, commits = len(world.wakes), commits_sent()  # type: ignore[attr-defined]
    changed, refused = world.scheduler.waiting.change_many(jobs, action)
    assert commits_sent() - commits == 1
    assert len(world.wakes) - wakes_before == (0 if action == "hold" else 1)  # type: ignore[attr-defined]
    assert refused == {}
    assert [j.id for j in changed] == ids
    assert {world.state(i) for i in ids} == {after}


def test_priority_of_many_and_the_refusals_each_said(world: World) -> None:
    waiting = [world.submit() for _ in range(3)]
    running = world.submit(mem=8 * GiB)
    world.tick()
    started = [i for i in [*waiting, running] if world.state(i) == JobState.RUNNING]
    assert started  # 80 GiB fits them all: every one runs
    held = world.submit(held=True)
    jobs = [world.scheduler.store.jobs.get(i) for i in [started[0], held]]
    changed, refused = world.scheduler.waiting.change_many(jobs, "priority", 7)
    assert [j.id for j in changed] == [held]
    assert world.job(held).priority == 7
    assert refused == {
        started[0]: f"job {started[0]} is running: only a waiting job's priority can change"
    }
