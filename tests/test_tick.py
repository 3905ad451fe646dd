"""Scheduling scenarios driven one `Scheduler.tick()` at a time, spawning no process.

A real Store (SQLite in a temp dir) and the real policy; the launcher, the GPUs and the
clock are test doubles of their interfaces (tests/fakes.py), so each test says exactly
what the hardware shows and how each job's supervisor reports its end. The harness
(`World`, `make_world`) is tests/world.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from gpusched.core.models import Drain, EndReason, JobState
from gpusched.daemon.main import run_sooner
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.context import Context
from gpusched.scheduling.scheduler import Scheduler
from gpusched.scheduling.starting import FIRST_POLL_S
from gpusched.store import NewJob
from tests.fakes import GiB
from tests.world import EXITED_0, World, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = make_world(tmp_path, [24 * GiB, 24 * GiB])
    yield made
    made.scheduler.store.close()


def test_a_job_goes_to_the_gpu_with_the_most_available_memory(world: World) -> None:
    world.probe.hold(4242, 0, 6 * GiB)  # a process gpusched did not start, on GPU 0
    job = world.submit(8 * GiB)
    world.tick()
    assert world.state(job) == JobState.RUNNING
    assert world.gpus_of(job) == [1]
    assert world.launcher.started == [job]


def test_each_job_goes_where_most_is_available_and_status_counts_the_claims(
    tmp_path: Path,
) -> None:
    """The daemon tier's placement scenario (it was test_end_to_end's, with `sleep 30`
    jobs): successive jobs on two idle 24G cards, each where the most is available,
    with the daemon's default headroom (512M kept free on every card)."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB], headroom="512M")
    first = world.submit(10 * GiB)
    world.tick()
    assert world.gpus_of(first) == [0]  # a tie: the first card
    second = world.submit(4 * GiB)
    world.tick()
    assert world.gpus_of(second) == [1]  # 20G available there, 14G on card 0
    third = world.submit(8 * GiB)
    world.tick()
    assert world.gpus_of(third) == [1]  # 20G > 14G again
    fourth = world.submit(8 * GiB)
    world.tick()
    assert world.gpus_of(fourth) == [0]  # 14G > 12G
    reports = world.scheduler.gpu_reports(world.scheduler.store.jobs.running())
    gpus = {report.index: report for report in reports}
    assert sorted(gpus[0].jobs) == sorted([first, fourth])
    # Nothing allocated yet: the claims are reserved, and what is available already
    # counts them and the headroom.
    assert gpus[0].used + gpus[0].reserved == 18 * GiB
    assert gpus[0].available == 6 * GiB - GiB // 2
    world.scheduler.store.close()


def test_status_lists_the_cards_before_the_first_pass(world: World) -> None:
    """A daemon answers before its first pass ends: `status` then reads the cards now, as a
    submit does, instead of showing a server with no GPU."""
    reports = world.scheduler.gpu_reports([])
    assert [report.index for report in reports] == [0, 1]
    assert all(report.available > 0 for report in reports)


def test_jobs_share_a_card_while_their_declarations_fit(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    first, second = world.submit(10 * GiB), world.submit(10 * GiB)
    world.tick()
    assert [world.state(first), world.state(second)] == [JobState.RUNNING, JobState.RUNNING]
    assert world.gpus_of(first) == world.gpus_of(second) == [0]


def test_a_card_is_never_overcommitted(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    first, second = world.submit(16 * GiB), world.submit(16 * GiB)
    world.tick()
    world.tick()
    assert world.state(first) == JobState.RUNNING
    # Declared but not yet allocated: the running job still holds its whole claim.
    assert world.state(second) == JobState.QUEUED
    assert world.job(second).waiting_reason
    assert world.launcher.started == [first]


def test_a_whole_gpu_job_waits_for_a_card_with_no_gpusched_job(world: World) -> None:
    small = world.submit(2 * GiB)
    whole = world.submit(None)
    world.tick()
    assert world.gpus_of(small) == [0]
    assert world.gpus_of(whole) == [1]
    late = world.submit(2 * GiB)  # may not join the whole-GPU job's card
    world.tick()
    assert world.gpus_of(late) == [0]


def test_a_multi_gpu_job_starts_on_as_many_cards(world: World) -> None:
    job = world.submit(8 * GiB, gpus=2)
    world.tick()
    assert sorted(world.gpus_of(job)) == [0, 1]


def test_the_user_who_used_least_goes_first(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    used = world.submit(None, user="alice")
    world.tick()
    world.clock.advance(3600)  # alice held the whole card for an hour
    world.finish(used)
    alices, bobs = world.submit(None, user="alice"), world.submit(None, user="bob")
    world.tick()
    assert world.state(bobs) == JobState.RUNNING
    assert world.state(alices) == JobState.QUEUED


def test_higher_priority_starts_first(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    low = world.submit(None)
    high = world.submit(None, priority=5)
    world.tick()
    assert world.state(high) == JobState.RUNNING
    assert world.state(low) == JobState.QUEUED


def test_a_dependent_job_waits_for_its_dependency_to_succeed(world: World) -> None:
    first = world.submit()
    then = world.submit(after=(first,))
    world.tick()
    assert world.state(then) == JobState.QUEUED
    assert world.job(then).waiting_reason == f"waiting for job {first}"
    world.finish(first)
    world.tick()
    assert world.state(then) == JobState.RUNNING


def test_a_dependent_job_ends_when_its_dependency_failed(world: World) -> None:
    first = world.submit()
    then = world.submit(after=(first,))
    world.tick()
    world.finish(first, Outcome(OutcomeKind.EXIT, exit_code=3))
    world.tick()
    job = world.job(then)
    assert (job.state, job.reason) == (JobState.CANCELLED, EndReason.DEPENDENCY_FAILED)
    assert f"job {first} ended failed" in (job.reason_detail or "")
    assert world.launcher.started == [first]


def test_a_held_job_waits_until_released(world: World) -> None:
    job = world.submit(held=True)
    world.tick()
    assert world.state(job) == JobState.HELD
    world.scheduler.waiting.release(world.job(job))
    world.tick()
    assert world.state(job) == JobState.RUNNING


def test_a_user_at_max_running_waits_for_their_own_jobs(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB, 24 * GiB], limits={"default": {"max_running": 1}})
    first, second = world.submit(2 * GiB), world.submit(2 * GiB)
    bobs = world.submit(2 * GiB, user="bob")
    world.tick()
    assert [world.state(j) for j in (first, second, bobs)] == [
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.RUNNING,
    ]
    assert "max_running" in (world.job(second).waiting_reason or "")
    world.finish(first)
    world.tick()
    assert world.state(second) == JobState.RUNNING


def test_an_array_runs_at_most_max_concurrent_at_once(world: World) -> None:
    new = NewJob(
        user="alice",
        uid=1000,
        gid=1000,
        command=["sweep.py"],
        cwd="/",
        env={},
        umask=0o022,
        mem=GiB,
        max_concurrent=2,
    )
    ids = [j.id for j in world.scheduler.submit_many([new] * 5, as_array=True)]
    world.tick()
    assert [world.state(i) for i in ids].count(JobState.RUNNING) == 2
    world.finish(ids[0])
    world.tick()
    assert [world.state(i) for i in ids].count(JobState.RUNNING) == 2
    assert world.state(ids[2]) == JobState.RUNNING  # the next in submit order


def test_a_drain_starts_nothing_until_lifted(world: World) -> None:
    running = world.submit()
    world.tick()
    world.scheduler.set_drain(Drain("root", "2026-01-05T09:00:00+00:00", "driver update"))
    waiting = world.submit()
    world.tick()
    assert world.state(running) == JobState.RUNNING  # running jobs go on
    assert world.state(waiting) == JobState.QUEUED
    assert "driver update" in (world.job(waiting).waiting_reason or "")
    world.scheduler.set_drain(None)
    world.tick()
    assert world.state(waiting) == JobState.RUNNING


def test_the_head_job_keeps_its_cards_while_small_jobs_pass_elsewhere(world: World) -> None:
    a, b = world.submit(20 * GiB), world.submit(20 * GiB)
    world.tick()
    big = world.submit(20 * GiB, gpus=2)  # needs both cards: claims them
    # 6G: more than the 4G each card keeps beside the head once its job ends (a job that
    # small may share a kept card: memory backfill, tests/test_tick_placement.py).
    small = world.submit(6 * GiB)
    world.tick()
    assert world.state(big) == JobState.QUEUED
    assert world.state(small) == JobState.QUEUED  # no card it could take is unclaimed
    world.finish(a)
    world.tick()
    assert world.state(small) == JobState.QUEUED  # GPU freed for the head, not for it
    world.finish(b)
    world.tick()
    assert world.state(big) == JobState.RUNNING


def test_a_job_ending_frees_its_card_at_the_next_tick(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    first, second = world.submit(None), world.submit(None)
    world.tick()
    assert world.state(second) == JobState.QUEUED
    world.finish(first)
    assert (world.state(first), world.job(first).exit_code) == (JobState.DONE, 0)
    assert world.state(second) == JobState.QUEUED  # nothing starts between ticks
    world.tick()
    assert world.state(second) == JobState.RUNNING


def test_a_job_stopped_at_its_time_limit_fails_with_reason_timeout(world: World) -> None:
    job = world.submit(time_limit_s=60)
    world.tick()
    world.finish(job, Outcome(OutcomeKind.TIMEOUT, message="time limit 1m reached"))
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.TIMEOUT)
    assert ended.reason_detail == "time limit 1m reached"


def test_a_job_over_its_memory_is_stopped_with_overrun_kill(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB], overrun="kill")
    job = world.submit(4 * GiB)
    world.tick()
    world.probe.hold(world.launcher.running[job], 0, 12 * GiB)
    world.tick()
    assert world.launcher.stop_requests == [job]  # asked, not ended inline
    assert world.state(job) == JobState.RUNNING
    world.finish(job, Outcome(OutcomeKind.CANCELLED))  # its supervisor stopped it
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.OVERRUN)
    assert (ended.reason_detail or "").startswith(f"job {job} uses 12.0G on GPU 0")


def test_a_cancelled_running_job_ends_cancelled_by_whom(world: World) -> None:
    job = world.submit()
    world.tick()
    world.scheduler.cancel(world.job(job), by="bob")
    assert world.launcher.stop_requests == [job]
    # Killed before its supervisor could record anything: the cancel still won.
    world.finish(job, Outcome(OutcomeKind.LOST))
    ended = world.job(job)
    assert (ended.state, ended.reason, ended.reason_detail) == (
        JobState.CANCELLED,
        EndReason.CANCELLED,
        "cancelled by bob",
    )


def test_a_job_whose_supervisor_is_gone_after_a_restart_is_lost(world: World) -> None:
    gone, alive = world.submit(), world.submit()
    world.tick()
    world.launcher.running.pop(gone)  # died while no daemon was running
    # A restart: a new scheduler on the same database and the same supervisors.
    again = Scheduler(
        Context.build(
            world.scheduler.context.settings,
            world.scheduler.store,
            world.probe,
            world.launcher,
            clock=world.clock,
        )
    )
    again.adopt_running()
    lost = again.store.jobs.get(gone)
    assert (lost.state, lost.reason) == (JobState.LOST, EndReason.LOST)
    assert "supervisor was gone" in (lost.reason_detail or "")
    assert again.store.jobs.get(alive).state == JobState.RUNNING  # re-adopted
    world.launcher.finish(alive, EXITED_0)  # its end now reaches the new scheduler
    assert again.store.jobs.get(alive).state == JobState.DONE


def test_a_job_out_of_gpu_memory_is_retried_with_more(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    job = world.submit(8 * GiB, retry_oom=1)
    world.tick()
    world.launcher.log_path(job).write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    world.finish(job, Outcome(OutcomeKind.EXIT, exit_code=1))
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.OOM)
    retry = world.scheduler.store.jobs.latest_attempts([job])[job]
    assert retry.id != job
    assert retry.mem == 12 * GiB
    world.tick()
    assert world.state(retry.id) == JobState.RUNNING


def test_a_job_that_cannot_start_fails_and_frees_its_card(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    broken, next_one = world.submit(None), world.submit(None)
    world.launcher.refuse[broken] = "cannot prepare job directories: disk full"
    world.tick()
    job = world.job(broken)
    assert (job.state, job.reason) == (JobState.FAILED, EndReason.FAILED_TO_START)
    world.tick()
    assert world.state(next_one) == JobState.RUNNING


def test_a_start_asks_for_a_pass_a_second_later_to_poll_the_new_job(tmp_path: Path) -> None:
    """A job that declares little and allocates much in its first seconds is seen by a
    poll a second after its start (its peak reserved, or it is stopped by `overrun:
    kill`), not a poll interval later."""
    asked: list[float] = []
    world = make_world(tmp_path, [24 * GiB], wake_in=asked.append)
    world.tick()
    assert asked == []  # nothing started: no extra pass
    job = world.submit(GiB)
    world.tick()
    assert world.state(job) == JobState.RUNNING
    assert asked == [FIRST_POLL_S] and FIRST_POLL_S <= 1.0
    world.tick()
    assert asked == [FIRST_POLL_S]


def test_run_sooner_moves_the_tick_forward_never_back() -> None:
    """The daemon's side of `wake_in`, on a real APScheduler."""
    ticks = BackgroundScheduler(timezone=timezone.utc)
    ticks.start(paused=True)
    try:
        now = datetime.now(timezone.utc)
        ticks.add_job(
            print, "interval", seconds=60, id="tick", next_run_time=now + timedelta(seconds=60)
        )
        assert run_sooner(ticks, "tick", now + timedelta(seconds=1))
        assert ticks.get_job("tick").next_run_time == now + timedelta(seconds=1)
        assert not run_sooner(ticks, "tick", now + timedelta(seconds=30))
        assert ticks.get_job("tick").next_run_time == now + timedelta(seconds=1)
        assert not run_sooner(ticks, "absent", now)
    finally:
        ticks.shutdown(wait=False)
