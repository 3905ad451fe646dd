"""A node's write whose COMMIT the database applied but whose answer never came back (a
partition or a reset at that instant; in the daemon, the wait bound of
gpusched.store.waits then raises the driver's OperationalError), at the tick level, on
both databases: the cluster must not be left holding what the node believes undone.

The lost answer is made on the node's own engine: its dialect's COMMIT runs, then raises
the driver's own OperationalError, as the wait bound does (tests/world.py
`make_cluster`; nothing of the project is replaced).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from gpusched.core.models import JobState
from gpusched.processes.pidref import process_start_time
from gpusched.scheduling.cluster.agent import ClusterAgent
from tests.fakes import GiB
from tests.world import EXITED_0, World, make_cluster


def _agent(world: World) -> ClusterAgent:
    placer = world.scheduler.placer
    assert isinstance(placer, ClusterAgent)
    return placer


def _answer_lost(world: World, wanted: Callable[[str], bool]) -> list[str]:
    """The next transaction of this node that runs a statement `wanted` picks: its COMMIT
    is applied, then its answer is lost (the driver's OperationalError). Returns the
    statements so caught (one, once it happened)."""
    engine = world.scheduler.store.database.engine
    dialect = engine.dialect
    real_commit = dialect.do_commit
    caught: list[str] = []
    pending: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not caught and wanted(statement):
            pending.append(statement)

    def commit(dbapi_connection: Any) -> None:
        real_commit(dbapi_connection)
        if pending and not caught:
            caught.append(pending.pop())
            raise dialect.loaded_dbapi.OperationalError("no answer from the database (test)")

    event.listen(engine, "after_cursor_execute", note)
    dialect.do_commit = commit  # type: ignore[method-assign]
    return caught


def _failing_tick(world: World) -> None:
    """A pass that fails on the lost answer (the daemon's loop logs it and goes on)."""
    with pytest.raises(OperationalError, match="no answer"):
        world.scheduler.tick()
    world.clock.advance(2)


def _claim(statement: str) -> bool:
    return statement.startswith("UPDATE jobs SET state") and "started_at" in statement


@pytest.fixture
def pair(tmp_path: Path, shared_db: str) -> Iterator[tuple[World, World]]:
    """Nodes a (elected) and b, one 24G card each, on the shared database; closed after."""
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], database=shared_db)
    try:
        a.tick()  # a is elected
        b.tick()
        yield a, b
    finally:
        for world in (a, b):
            world.scheduler.store.close()


def test_a_claim_committed_whose_answer_was_lost_is_given_back_and_started_once(
    pair: tuple[World, World],
) -> None:
    a, b = pair
    job = a.submit(8 * GiB, allowed_nodes=("b",))
    a.tick()  # placed on b
    caught = _answer_lost(b, _claim)
    _failing_tick(b)  # the claim commits; b hears an error and launches nothing
    assert caught, "the claim was not made"
    assert b.launcher.started == []
    assert (a.state(job), a.job(job).node, a.job(job).pid) == (JobState.RUNNING, "b", None)
    # b is live and renewing: nobody declares it down, so b itself must notice that it
    # holds a claim it never launched (it stayed `running` for good: issue 26's stall).
    for _ in range(4):
        a.tick()
        b.tick()
    assert b.launcher.started == [job]  # once
    assert a.state(job) == JobState.RUNNING
    assert a.job(job).pid == b.launcher.running[job]
    b.finish(job, EXITED_0)
    b.tick()
    assert a.state(job) == JobState.DONE


def test_a_launch_whose_pid_write_lost_its_answer_is_recorded_and_ends_once(
    pair: tuple[World, World],
) -> None:
    a, b = pair
    job = a.submit(8 * GiB, allowed_nodes=("b",))
    a.tick()
    caught = _answer_lost(
        b, lambda s: s.startswith("UPDATE jobs SET started_at") and "pid_start_time" in s
    )
    _failing_tick(b)  # claimed and launched; recording the supervisor's pid hears an error
    assert caught, "the launch was not recorded"
    assert b.launcher.started == [job]
    for _ in range(2):
        a.tick()
        b.tick()
    assert b.launcher.started == [job]  # not launched again
    assert job in _agent(b).node.local  # this node knows it runs it (to reconcile it later)
    assert a.job(job).pid == b.launcher.running[job]
    b.finish(job, EXITED_0)
    b.tick()
    assert a.state(job) == JobState.DONE


def _until(condition: Callable[[], bool], *worlds: World, passes: int = 40) -> None:
    for _ in range(passes):
        if condition():
            return
        for world in worlds:
            world.tick()
    raise AssertionError(f"not after {passes} rounds")


def test_a_take_back_whose_answer_was_lost_still_records_the_job_s_end(
    pair: tuple[World, World],
) -> None:
    """b, back after being declared down, takes back its `--requeue` run still going (the
    job `running` on b again, under b's new epoch), but the answer to that COMMIT is
    lost: b must still record the job's end when the run ends (before: b kept the run
    under its old epoch, its end was refused, the job stayed `running` for good)."""
    a, b = pair
    again = a.submit(20 * GiB, allowed_nodes=("b",), requeue=1)
    a.tick()
    b.tick()
    assert (a.state(again), a.job(again).node) == (JobState.RUNNING, "b")
    _until(lambda: a.state(again) == JobState.QUEUED, a)  # b silent: declared down
    caught = _answer_lost(b, lambda s: s.startswith("UPDATE jobs SET state") and "gpu_uuids" in s)
    _failing_tick(b)  # back: it rejoins and takes its run back; the answer is lost
    assert caught, "nothing was taken back"
    assert (a.state(again), a.job(again).node) == (JobState.RUNNING, "b")
    for _ in range(2):
        a.tick()
        b.tick()
    assert b.launcher.started == [again]  # never run a second time
    b.finish(again, EXITED_0)
    b.tick()
    assert a.state(again) == JobState.DONE


def test_an_interactive_claim_whose_answer_was_lost_still_starts_its_client_once(
    pair: tuple[World, World],
) -> None:
    """An interactive job (`gpusched run`: its client is the job) placed on b, whose claim
    commits but b hears an error: nothing is launched for it either way, so b must not
    give it back or end it as a stray; its waiting client learns it runs (it reads the
    row), and its report ends it, once."""
    a, b = pair
    client = subprocess.Popen(["sleep", "60"])
    try:
        job = a.submit(
            8 * GiB,
            allowed_nodes=("b",),
            client_pid=client.pid,
            client_start_time=process_start_time(client.pid),
        )
        a.tick()  # placed on b, where its client runs
        caught = _answer_lost(b, _claim)
        _failing_tick(b)
        assert caught, "the claim was not made"
        assert b.scheduler.interactive.wait_placed(job, 5).state == JobState.RUNNING
        for _ in range(4):
            a.tick()
            b.tick()
        placed = a.job(job)
        assert (placed.state, placed.node, placed.pid) == (JobState.RUNNING, "b", client.pid)
        assert b.launcher.started == []  # an interactive job is its client: never launched
        b.scheduler.interactive.finish(b.job(job), 0, None)
        b.tick()
        assert a.state(job) == JobState.DONE
    finally:
        client.kill()
        client.wait()
