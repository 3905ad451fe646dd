"""The requests of placement: `gpusched top` (administrators only) and `--exclusive` /
`--share` on submit and run, through `handlers.dispatch` as tests/test_handlers.py does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.errors import PermissionDenied, UsageError
from gpusched.core.models import JobState
from tests.fakes import GiB
from tests.test_handlers import ALICE, BOB, ROOT, VALID, Daemon
from tests.test_tick import make_world


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    world = make_world(tmp_path, [24 * GiB])
    yield Daemon(world)
    world.scheduler.store.close()


def test_only_an_administrator_puts_a_job_before_other_users(daemon: Daemon) -> None:
    world = daemon.world
    running = daemon.queue(ALICE, mem=20 * GiB)
    world.tick()
    alices = daemon.queue(ALICE, mem=20 * GiB, priority=100)
    bobs = daemon.queue(BOB, mem=20 * GiB)
    with pytest.raises(PermissionDenied, match="only an administrator"):
        daemon.ask(BOB, "top", id=bobs)
    assert daemon.ask(ROOT, "top", id=bobs)["top"] == 1
    world.finish(running)
    world.tick()
    assert world.state(bobs) == JobState.RUNNING
    assert world.state(alices) == JobState.QUEUED
    with pytest.raises(Exception, match="only a waiting job"):
        daemon.ask(ROOT, "top", id=bobs)


def test_exclusive_and_share_are_stored_and_conflict(daemon: Daemon) -> None:
    job = daemon.ask(ROOT, "submit", **VALID, exclusive=True)
    assert job["exclusive"] is True
    assert job["share"] is False
    assert daemon.ask(ROOT, "submit", **VALID, share=True)["share"] is True
    with pytest.raises(UsageError, match="--exclusive and --share conflict"):
        daemon.ask(ROOT, "submit", **VALID, exclusive=True, share=True)
