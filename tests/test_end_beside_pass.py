"""A job's end is recorded while a pass looks at the host: the walk of every process on
the host (which of them hold GPU memory for which job) and the GPU reading are made
outside the scheduler's lock that recording an end takes (scheduling.phases).

The walk is made slow here by blocking psutil's process iterator (the host's, not the
project's) until the test has seen the end recorded or given up on it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.core.models import JobState
from tests.fakes import GiB
from tests.world import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path, [80 * GiB])


class SlowWalk:
    """psutil.process_iter that, once armed, stops at its first call until let go."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.walking = threading.Event()
        self.go_on = threading.Event()
        real = psutil.process_iter

        def process_iter(*args: Any, **kwargs: Any) -> Iterator[psutil.Process]:
            if self.armed:
                self.walking.set()
                self.go_on.wait(30)
            return real(*args, **kwargs)

        monkeypatch.setattr(psutil, "process_iter", process_iter)


def test_an_end_is_recorded_while_the_pass_walks_the_host_s_processes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = world.submit(mem=8 * GiB), world.submit(mem=8 * GiB)
    world.tick()
    assert world.state(first) == world.state(second) == JobState.RUNNING
    world.probe.hold(world.launcher.running[first], 0, 4 * GiB)  # a walk is needed
    walk = SlowWalk(monkeypatch)
    walk.armed = True
    passing = threading.Thread(target=world.scheduler.tick)
    passing.start()
    try:
        assert walk.walking.wait(10), "the pass never walked the host's processes"
        ending = threading.Thread(target=world.finish, args=(second,))
        ending.start()
        ending.join(5)  # recording one end: milliseconds, unless it waits for the lock
        recorded = not ending.is_alive()
    finally:
        walk.go_on.set()
        passing.join(30)
    ending.join(30)
    assert recorded, "the end waited for the pass's walk of the host's processes"
    assert world.state(second) == JobState.DONE
    assert world.job(first).mem_used == 4 * GiB  # the walk still attributes the memory
