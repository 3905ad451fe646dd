"""A long queue stays light between passes (issue 30: one tick with 10,000 queued): a
queued job's row unchanged since the last pass is not decoded again (store `queued_of`),
nor its `WaitingJob` built again (policy_inputs.WaitingJobs); a row that changed is.
Counted by identity, never timed: the timing is benchmarks/scheduling_pass.py. And what
is kept never hides a change from the plan: the pass rules see every change."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.models import JobState
from gpusched.scheduling.policy_inputs import WaitingJobs
from tests.fakes import GiB
from tests.world import World, make_world


def _queue_behind_a_whole_gpu_job(tmp_path: Path, waiting: int) -> tuple[World, int, list[int]]:
    world = make_world(tmp_path, [24 * GiB])
    blocker = world.submit(None)
    world.tick()
    assert world.state(blocker) == JobState.RUNNING
    return world, blocker, [world.submit(20 * GiB) for _ in range(waiting)]


def test_an_unchanged_queued_row_is_read_once_and_a_changed_one_again(tmp_path: Path) -> None:
    world, _, ids = _queue_behind_a_whole_gpu_job(tmp_path, 3)
    store = world.scheduler.store
    before, again = store.jobs.queued(), store.jobs.queued()
    assert [job.id for job in again] == ids
    assert all(a is b for a, b in zip(before, again, strict=True))
    store.jobs.set_priority(ids[1], 5)
    after = store.jobs.queued()
    assert after[1] is not again[1] and after[1].priority == 5
    assert after[0] is again[0] and after[2] is again[2]


def test_each_waiting_job_is_built_once_while_its_row_is_unchanged(tmp_path: Path) -> None:
    world, _, ids = _queue_behind_a_whole_gpu_job(tmp_path, 3)
    store, now = world.scheduler.store, world.clock()
    views = WaitingJobs()
    first = [views.anywhere(job, now)[0] for job in store.jobs.queued()]
    views.new_pass()
    second = [views.anywhere(job, now)[0] for job in store.jobs.queued()]
    assert all(a is b for a, b in zip(first, second, strict=True))
    store.jobs.set_priority(ids[2], 7)
    views.new_pass()
    third = [views.anywhere(job, now)[0] for job in store.jobs.queued()]
    assert third[:2] == second[:2] and third[0] is second[0]
    assert third[2] is not second[2] and third[2] is not None and third[2].priority == 7


def test_a_change_between_passes_reaches_the_plan(tmp_path: Path) -> None:
    """Kept views never outlive their row: a priority raised and a job held while both
    wait decide the next start, as they would with nothing kept."""
    world, blocker, (low, high, held) = _queue_behind_a_whole_gpu_job(tmp_path, 3)
    store = world.scheduler.store
    store.jobs.set_priority(held, 9)
    world.tick()
    world.tick()  # all three wait, their views kept
    store.jobs.set_priority(high, 5)
    store.jobs.hold(held)
    world.finish(blocker)
    world.tick()
    world.tick()
    assert world.state(high) == JobState.RUNNING
    assert world.state(low) == JobState.QUEUED
    assert world.state(held) == JobState.HELD


def test_rows_whose_json_the_driver_decoded_are_kept_too() -> None:
    """psycopg hands PostgreSQL's json columns back as lists (unhashable): still one
    `Queued` per unchanged row, and a new one for a changed row."""
    from gpusched.store.queued import queued_of

    def row(job_id: int, after: list[int]) -> tuple[object, ...]:
        return (job_id, "alice", 2**30, 1, 0, after, None, None, None, 0, ["a", "b"], None)

    first, known = queued_of([row(1, []), row(2, [1])], {})
    again, known = queued_of([row(1, []), row(2, [1])], known)
    assert again[0] is first[0] and again[1] is first[1] and again[1].after == [1]
    changed, _ = queued_of([row(1, []), row(2, [1, 3])], known)
    assert changed[0] is first[0] and changed[1] is not first[1]
    assert changed[1].after == [1, 3] and changed[1].allowed_nodes == ["a", "b"]
