"""A job's run time is measured on the monotonic clock: a jump of the wall clock while it
runs moves its started_at or ended_at, not how long it is said and charged to have run.

The scheduler is the daemon's own (a real store, launcher and supervisor) with a wall
clock of the test's that jumps two hours ahead mid-run; the host's clock is left alone.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpusched.cli.history_view import history_lines
from gpusched.cli.render import ran_for
from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import load_config
from gpusched.core.clock import utc_now
from gpusched.core.models import JobState
from gpusched.gpus.probe import SimulatedProbe
from gpusched.processes.launcher import Launcher
from gpusched.scheduling.context import Context
from gpusched.scheduling.fair_share import charged_bytes, usage_by_user
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import NewJob, Store
from tests.daemon_harness import directory_settings, eventually, job_until

JUMP = timedelta(hours=2)
GIB = 1 << 30


class JumpingClock:
    """This machine's clocks, but the wall clock is `offset` ahead once the test says."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return utc_now() + self.offset

    def monotonic(self) -> float:
        return time.monotonic()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Scheduler, JumpingClock]]:
    holder = ConfigHolder(load_config(None, directory_settings(tmp_path, "1x24G")))
    clock = JumpingClock()
    context = Context.build(
        holder,
        Store(holder.current.database_url),
        SimulatedProbe.from_spec("1x24G"),
        Launcher(holder),
        clock=clock,
    )
    scheduler = Scheduler(context)
    yield scheduler, clock
    scheduler.context.launcher.close()
    scheduler.store.close()


def test_a_job_that_ran_across_a_wall_clock_jump_is_recorded_and_charged_its_run_time(
    tmp_path: Path, world: tuple[Scheduler, JumpingClock]
) -> None:
    scheduler, clock = world
    go = tmp_path / "go"
    new = NewJob(
        user="root",
        uid=os.getuid(),
        gid=os.getgid(),
        command=[sys.executable, "-c", job_until(go, tmp_path / "ran", 0)],
        cwd=str(tmp_path),
        env={"PATH": os.environ["PATH"]},
        umask=0o077,
        mem=GIB,
    )
    job_id = scheduler.submit(new).id
    scheduler.tick()
    eventually(lambda: scheduler.store.jobs.get(job_id).pid, 30)
    clock.offset = JUMP  # NTP, or someone's `date -s`, while it runs
    go.touch()
    scheduler.endings.wait_until_ended([job_id], 30)
    job = scheduler.store.jobs.get(job_id)
    assert job.state == JobState.DONE, job
    assert job.started_at is not None and job.ended_at is not None
    wall = datetime.fromisoformat(job.ended_at) - datetime.fromisoformat(job.started_at)
    assert wall > JUMP  # what the wall clock says: two hours and then some
    assert job.run_s is not None and 0 < job.run_s < 60, job.run_s
    assert ran_for(job, clock()) == job.run_s
    (line,) = history_lines([job], 200)[1:]
    assert "2h" not in line, line
    # Charged for its run time (a half-life of decades: no decay to speak of).
    charged = usage_by_user(scheduler.store.jobs, {}, clock(), 1e9)["root"]
    assert charged == pytest.approx(charged_bytes(job, {}) * job.run_s, rel=0.01)
