"""`--after ID[:ok|:any|:failed]`, one pass at a time: a dependent starts when each of
its conditions holds (`ok`: the job succeeded, the default; `any`: it ended, however;
`failed`: it ended without succeeding, Slurm's afternotok), waits while one may still
hold, and is ended (`dependency_failed`) when one no longer can.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.models import EndReason, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from tests.fakes import GiB
from tests.world import World, make_world

FAILED_3 = Outcome(OutcomeKind.EXIT, exit_code=3)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = make_world(tmp_path, [24 * GiB, 24 * GiB])
    yield made
    made.scheduler.store.close()


def test_after_any_starts_once_the_dependency_ended_however(world: World) -> None:
    first = world.submit()
    then = world.submit(after=(first,), after_when=("any",))
    world.tick()
    assert world.state(then) == JobState.QUEUED
    assert world.job(then).waiting_reason == f"waiting for job {first} (to end)"
    world.finish(first, FAILED_3)
    world.tick()
    assert world.state(then) == JobState.RUNNING


def test_after_failed_starts_only_if_the_dependency_did_not_succeed(world: World) -> None:
    first = world.submit()
    cleanup = world.submit(after=(first,), after_when=("failed",))
    world.tick()
    assert world.job(cleanup).waiting_reason == f"waiting for job {first} (to fail)"
    world.finish(first, FAILED_3)
    world.tick()
    assert world.state(cleanup) == JobState.RUNNING


def test_after_failed_is_ended_when_the_dependency_succeeded(world: World) -> None:
    first = world.submit()
    cleanup = world.submit(after=(first,), after_when=("failed",))
    world.tick()
    world.finish(first)
    world.tick()
    job = world.job(cleanup)
    assert (job.state, job.reason) == (JobState.CANCELLED, EndReason.DEPENDENCY_FAILED)
    assert f"job {first} ended done" in (job.reason_detail or "")
    assert f"--after {first}:failed" in (job.reason_detail or "")
    assert world.launcher.started == [first]


def test_a_cancelled_dependency_satisfies_failed_and_any_but_not_ok(world: World) -> None:
    first = world.submit(held=True)
    on_fail = world.submit(after=(first,), after_when=("failed",))
    on_any = world.submit(after=(first,), after_when=("any",))
    on_ok = world.submit(after=(first,))
    world.scheduler.cancel(world.job(first), by="alice")
    world.tick()
    assert world.state(on_fail) == JobState.RUNNING
    assert world.state(on_any) == JobState.RUNNING
    assert world.job(on_ok).reason == EndReason.DEPENDENCY_FAILED


def test_each_condition_of_a_mixed_list_must_hold(world: World) -> None:
    good, bad = world.submit(), world.submit()
    then = world.submit(after=(good, bad), after_when=("ok", "failed"))
    world.tick()
    assert world.job(then).waiting_reason == f"waiting for job {good}, {bad} (to fail)"
    world.finish(bad, FAILED_3)
    world.tick()
    assert world.job(then).waiting_reason == f"waiting for job {good}"
    world.finish(good)
    world.tick()
    assert world.state(then) == JobState.RUNNING


def test_the_conditions_are_kept_with_the_job(world: World) -> None:
    first = world.submit()
    plain = world.submit(after=(first,))
    then = world.submit(after=(first,), after_when=("any",))
    assert world.job(plain).after_when is None  # all `ok`: as every job before
    job = world.job(then)
    assert (job.after, job.after_when) == ([first], ["any"])
    assert job.to_json()["after_when"] == ["any"]
