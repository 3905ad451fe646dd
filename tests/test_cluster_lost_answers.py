"""A node's write whose COMMIT the database applied but whose answer never came back (a
partition or a reset at that instant; in the daemon, the wait bound of
gpusched.store.waits then raises the driver's OperationalError), at the tick level, on
both databases: the cluster must not be left holding what the node believes undone.

The lost answer is made on the node's own engine: its dialect's COMMIT runs, then raises
the driver's own OperationalError, as the wait bound does (tests/world.py
`make_cluster`; nothing of the project is replaced).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from gpusched.core.models import JobState
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


def _pair(tmp_path: Path, database: str) -> tuple[World, World]:
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], database=database)
    a.tick()  # a is elected
    b.tick()
    return a, b


def test_a_claim_committed_whose_answer_was_lost_is_given_back_and_started_once(
    tmp_path: Path, shared_db: str
) -> None:
    a, b = _pair(tmp_path, shared_db)
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
    tmp_path: Path, shared_db: str
) -> None:
    a, b = _pair(tmp_path, shared_db)
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
