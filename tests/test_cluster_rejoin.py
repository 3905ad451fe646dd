"""A `--requeue` job whose run ended by itself while its node was away (frozen, or cut
off from the database) past node_timeout: the node is declared down, the job queued
again, then the node is back. That run's exit is the job's end: it is not run again,
on that node or another (docs/cluster.md, "When things die").

At the tick level (tests/world.py `make_cluster`: two daemons' schedulers on one SQLite
file and one fixed clock). What the threads of a real daemon do in some order is made
here in the order that loses: a frozen daemon's exit watcher is heard only after the
passes that follow its thaw (it waits for the lock those passes hold); a partitioned
daemon's watcher fails to write the end while the pass looks at the host, and the
network heals before the pass goes on to rejoin. The partition is made on the node's own
engine (each statement raises the driver's OperationalError); nothing of the project is
replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from gpusched.core.models import GpuState, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from tests.fakes import GiB
from tests.world import World, make_cluster


def _pair(tmp_path: Path) -> tuple[World, World]:
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB])
    a.tick()  # a is elected
    b.tick()
    return a, b


def _until(condition: Callable[[], bool], *worlds: World, passes: int = 40) -> None:
    for _ in range(passes):
        if condition():
            return
        for world in worlds:
            world.tick()
    raise AssertionError(f"not after {passes} rounds")


@contextmanager
def _cut_off(world: World) -> Iterator[None]:
    """Every statement of this node fails as a partition makes it fail, until healed."""
    engine = world.scheduler.store.database.engine
    unreachable = engine.dialect.loaded_dbapi.OperationalError

    def refuse(*_args: Any) -> None:
        raise unreachable("the database is unreachable (test partition)")

    event.listen(engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", refuse)


def _back_frozen(b: World, job: int) -> Callable[[], None]:
    """b's daemon was frozen (SIGSTOP) while its run of `job` exited 0; it thaws and
    passes, its exit watcher not heard yet. Returns how the watcher is heard at last."""
    heard: list[int] = []
    b.launcher.on_exit = heard.append
    b.finish(job)  # its supervisor's exit record: exit 0
    b.tick()  # back: its renewal is refused, it reconciles and rejoins
    b.launcher.on_exit = b.scheduler.endings.on_job_exit

    def hear() -> None:
        for job_id in heard:
            b.scheduler.endings.on_job_exit(job_id)

    return hear


def _back_partitioned(b: World, job: int) -> Callable[[], None]:
    """b was cut off from the database; its run of `job` exits 0 as b's first pass since
    looks at the host, the watcher's write of that end fails (the database is still
    away), and the network heals before the pass goes on."""
    b.launcher.on_exit = b.scheduler.endings.on_job_exit
    snapshot = b.probe.snapshot

    def ends_then_heals() -> list[GpuState]:
        b.probe.snapshot = snapshot  # type: ignore[method-assign]
        with _cut_off(b):
            b.finish(job)
        assert b.scheduler.endings.unsettled == {job}  # its end waits for the next pass
        return snapshot()

    b.probe.snapshot = ends_then_heals  # type: ignore[method-assign]
    b.tick()
    return lambda: None


BACK = {"frozen": _back_frozen, "partitioned": _back_partitioned}


@pytest.mark.parametrize("away", sorted(BACK))
@pytest.mark.parametrize("rerun_on", ["same node", "another node"])
def test_a_requeued_run_that_ended_while_its_node_was_away_is_the_job_s_end(
    tmp_path: Path, away: str, rerun_on: str
) -> None:
    a, b = _pair(tmp_path)
    blocker = a.submit(None, allowed_nodes=("a",))  # a's card, whole: the job goes to b
    a.tick()
    job = a.submit(GiB, requeue=1, allowed_nodes=("b",) if rerun_on == "same node" else None)
    a.tick()
    b.tick()
    assert (a.state(job), a.job(job).node) == (JobState.RUNNING, "b")
    b.launcher.on_exit = lambda _job_id: None  # b is away: nothing of it is heard
    if away == "partitioned":
        with _cut_off(b):
            _until(lambda: a.state(job) == JobState.QUEUED, a)  # declared down: queued again
    else:
        _until(lambda: a.state(job) == JobState.QUEUED, a)
    if rerun_on == "another node":
        a.finish(blocker)  # a's card free as b comes back: the job would fit there
        b.probe.hold(999_999, 0, 24 * GiB)  # and b's is taken by a process outside gpusched
    hear_watcher = BACK[away](b, job)
    # Back and rejoined, b has recorded that run's exit as the job's end: no node can
    # start the job again from here on.
    ended = a.job(job)
    assert (ended.state, ended.exit_code, ended.node) == (JobState.DONE, 0, "b")
    for _ in range(3):
        a.tick()
        b.tick()
    hear_watcher()
    for _ in range(2):
        a.tick()
        b.tick()
    assert job not in a.launcher.started
    assert b.launcher.started.count(job) == 1  # never run a second time
    assert a.job(job) == ended
    (first,) = a.scheduler.store.attempts.earlier_runs([job])[job]
    assert first["node"] == "b" and first["outcome"].endswith("; then exited 0")


def test_an_earlier_run_s_exit_heard_late_does_not_end_the_run_that_goes_on(
    tmp_path: Path,
) -> None:
    """The first run's supervisor died without an exit record while b was frozen: that
    run's end is unknown, so the job runs again, here. The watcher's report of that first
    exit, heard only once the second run has started, is not the second run's end (before:
    the second run ended `lost` while it went on, its card no longer counting it)."""
    a, b = _pair(tmp_path)
    job = a.submit(20 * GiB, allowed_nodes=("b",), requeue=1)
    a.tick()
    b.tick()
    b.launcher.on_exit = lambda _job_id: None
    _until(lambda: a.state(job) == JobState.QUEUED, a)
    heard: list[int] = []
    b.launcher.on_exit = heard.append
    b.finish(job, Outcome(OutcomeKind.LOST, message="no exit record"))
    b.tick()  # back and rejoined: no record to end the job with, so it stays queued
    b.launcher.on_exit = b.scheduler.endings.on_job_exit
    _until(lambda: a.state(job) == JobState.RUNNING, a, b)
    assert b.launcher.started.count(job) == 2
    for job_id in heard:
        b.scheduler.endings.on_job_exit(job_id)
    assert a.state(job) == JobState.RUNNING
    beside = a.submit(20 * GiB, allowed_nodes=("b",))  # the second run counts on b's card
    for _ in range(3):
        a.tick()
        b.tick()
    assert a.state(beside) == JobState.QUEUED
    b.finish(job)
    assert (a.state(job), a.job(job).exit_code) == (JobState.DONE, 0)
