"""Bulk cancel of running jobs in one go (issue 27, item 15): `cancel --all` of 1,000
running jobs took a full scheduling pass per job (~10 minutes; others' requests waited
11-87 s). Now they are stopped in chunks under the scheduler's lock with one wake-up."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.models import JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.scheduler import CANCEL_CHUNK
from tests.fakes import GiB
from tests.test_tick import make_world


def test_cancelling_many_running_jobs_wakes_the_scheduler_once(tmp_path: Path) -> None:
    wakes: list[int] = []
    # Memory alone: under pack: contention new jobs of unknown demand start at most two
    # to a card per pass (issue 25's rule 3c), and this test wants them all running.
    world = make_world(tmp_path, [24 * GiB], wake=lambda: wakes.append(1), pack="memory")
    jobs = [world.submit(mem=GiB // 16) for _ in range(CANCEL_CHUNK + 50)]
    world.tick()
    assert all(world.state(job) == JobState.RUNNING for job in jobs)
    world.finish(jobs[0], Outcome(OutcomeKind.EXIT, exit_code=0))  # ends meanwhile: skipped
    wakes.clear()
    cancelled = world.scheduler.cancel_many([world.job(j) for j in jobs], by="alice")
    assert cancelled == jobs[1:]
    assert world.launcher.stop_requests == jobs[1:]
    assert len(wakes) == 1
    for job in jobs[1:]:
        world.finish(job, Outcome(OutcomeKind.CANCELLED))
        ended = world.job(job)
        assert (ended.state, ended.reason_detail) == (JobState.CANCELLED, "cancelled by alice")
