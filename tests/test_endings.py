"""How jobs end (gpusched/scheduling/endings.py), driven with no process.

A real Store (SQLite in a temp dir) and the scheduler's own `JobEndings`, on the test
doubles of the launcher, GPUs and clock (tests/fakes.py), built by tests/world.py's
`make_world`. A "restart" is a fresh FakeLauncher: it knows only the supervisors the
test says are still alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.models import EndReason, Job, JobState, StopIntent
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.endings import JobEndings
from tests.daemon_harness import eventually
from tests.fakes import FakeLauncher, GiB
from tests.world import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = make_world(tmp_path, [24 * GiB])
    yield made
    made.scheduler.store.close()


def _endings(world: World) -> JobEndings:
    return world.scheduler.endings


def wait_ended(endings: JobEndings, job_ids: list[int], timeout_s: float) -> list[Job]:
    """What the daemon's `wait` does: block until every job has ended or the timeout
    passes, then read their rows (an unknown id is left out)."""
    endings.wait_until_ended(job_ids, timeout_s)
    found = endings.jobs.get_many(job_ids)
    return [found[i] for i in job_ids if i in found]


def _running(world: World, **spec: object) -> int:
    job = world.submit(8 * GiB, **spec)  # type: ignore[arg-type]
    world.tick()
    assert world.state(job) == JobState.RUNNING
    return job


def _listen(world: World) -> list[tuple[int, bool]]:
    """The ends announced from now on."""
    del world.heard[:]
    return world.heard


# -- end(): recorded once, announced once ----------------------------------------------------


def test_end_records_state_reason_exit_code_and_time_once(world: World) -> None:
    job = _running(world)
    heard = _listen(world)
    ended_at = world.clock().isoformat()
    assert _endings(world).end(
        job, JobState.FAILED, EndReason.SIGNAL, exit_code=137, detail="killed by SIGKILL"
    )
    row = world.job(job)
    assert (row.state, row.reason, row.exit_code, row.reason_detail) == (
        JobState.FAILED,
        "signal",
        137,
        "killed by SIGKILL",
    )
    assert row.ended_at is not None and row.ended_at.startswith(ended_at[:19])

    world.clock.advance(60)  # a second ending, later: changes nothing, announces nothing
    assert not _endings(world).end(job, JobState.DONE, EndReason.EXIT, exit_code=0)
    again = world.job(job)
    assert (again.state, again.reason, again.exit_code, again.ended_at) == (
        JobState.FAILED,
        "signal",
        137,
        row.ended_at,
    )
    assert heard == [(job, False)]


def test_a_queued_job_can_be_ended_too(world: World) -> None:
    job = world.submit(8 * GiB, held=True)
    assert _endings(world).end(job, JobState.CANCELLED, EndReason.CANCELLED, detail="by alice")
    assert (world.state(job), world.job(job).reason) == (JobState.CANCELLED, "cancelled")


# -- waiters ------------------------------------------------------------------------------------


def test_a_waiter_returns_when_the_job_ends(world: World) -> None:
    job = _running(world)
    endings = _endings(world)
    found: list[JobState] = []
    waiter = threading.Thread(
        target=lambda: found.extend(j.state for j in wait_ended(endings, [job], 30.0)),
        daemon=True,
    )
    waiter.start()
    # Until it waits on the condition, its first read could see the end without a wake-up.
    eventually(lambda: vars(endings.ended)["_waiters"], timeout=5)
    world.finish(job)  # the launcher's watcher reports the exit
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "the waiter was not woken by the job's end"
    assert found == [JobState.DONE]


def test_a_waiter_returns_at_its_timeout_while_the_job_runs(world: World) -> None:
    job = _running(world)
    started = time.monotonic()
    rows = wait_ended(_endings(world), [job], 0.2)
    assert time.monotonic() - started >= 0.2
    assert [r.state for r in rows] == [JobState.RUNNING]


def test_a_waiter_on_an_ended_job_returns_at_once_with_its_row(world: World) -> None:
    job = _running(world)
    world.finish(job, Outcome(OutcomeKind.EXIT, exit_code=3))
    rows = wait_ended(_endings(world), [job, 999_999], 30.0)  # an unknown id is left out
    assert [(r.id, r.state, r.exit_code) for r in rows] == [(job, JobState.FAILED, 3)]


def test_a_waiter_on_two_jobs_waits_for_both(world: World) -> None:
    first, second = _running(world), _running(world)
    endings = _endings(world)
    waiter = threading.Thread(target=endings.wait_until_ended, args=([first, second], 30.0))
    waiter.daemon = True
    waiter.start()
    eventually(lambda: vars(endings.ended)["_waiters"], timeout=5)
    world.finish(first)
    eventually(lambda: vars(endings.ended)["_waiters"], timeout=5)  # woken, waits again
    assert waiter.is_alive()
    world.finish(second)
    waiter.join(timeout=5)
    assert not waiter.is_alive()


# -- settle(): each outcome's state and reason -------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome(OutcomeKind.EXIT, exit_code=0), (JobState.DONE, "exit", 0, None)),
        (Outcome(OutcomeKind.EXIT, exit_code=1), (JobState.FAILED, "exit", 1, None)),
        (
            Outcome(OutcomeKind.SIGNAL, signal=9, message="killed by SIGKILL"),
            (JobState.FAILED, "signal", None, "killed by SIGKILL"),
        ),
        (
            Outcome(OutcomeKind.TIMEOUT, message="ran past --time 1m"),
            (JobState.FAILED, "timeout", None, "ran past --time 1m"),
        ),
        (
            Outcome(OutcomeKind.FAILED_TO_START, message="train.py: not found"),
            (JobState.FAILED, "failed_to_start", None, "train.py: not found"),
        ),
        (
            Outcome(OutcomeKind.LOST, message="no exit record"),
            (JobState.LOST, "lost", None, "no exit record"),
        ),
        # Stopped with no request of the daemon's on record: said as the supervisor says.
        (
            Outcome(OutcomeKind.CANCELLED),
            (JobState.CANCELLED, "cancelled", None, "cancelled"),
        ),
    ],
)
def test_an_outcome_ends_a_running_job_as_it_says(
    world: World, outcome: Outcome, expected: tuple[JobState, str, int | None, str | None]
) -> None:
    """Expected: (state, reason, exit code, detail)."""
    job = _running(world)
    world.finish(job, outcome)  # through on_job_exit, as the launcher's watcher calls it
    row = world.job(job)
    assert (row.state, row.reason, row.exit_code, row.reason_detail) == expected


def test_a_command_that_could_not_fork_for_want_of_tasks_waits_in_the_queue(
    world: World,
) -> None:
    """Another user's job filled the service's task limit: the supervisor could not fork
    this job's command (EAGAIN). It never ran, so it is queued again, not failed."""
    job = _running(world)
    message = "could not start true: [Errno 11] Resource temporarily unavailable"
    world.finish(job, Outcome(OutcomeKind.FAILED_TO_START, message=message, transient=True))
    row = world.job(job)
    assert (row.state, row.reason, row.started_at, row.gpu_indices) == (
        JobState.QUEUED,
        None,
        None,
        [],
    )


def test_a_cancelled_job_ends_cancelled_with_who_cancelled_it(world: World) -> None:
    job = _running(world)
    world.scheduler.cancel(world.job(job), by="alice")
    assert world.launcher.stop_requests == [job]
    assert world.state(job) == JobState.RUNNING  # until its supervisor says it stopped
    world.finish(job, Outcome(OutcomeKind.CANCELLED))
    row = world.job(job)
    assert (row.state, row.reason, row.reason_detail) == (
        JobState.CANCELLED,
        "cancelled",
        "cancelled by alice",
    )


def test_a_cancel_that_killed_the_supervisor_before_it_started_wins(world: World) -> None:
    job = _running(world)
    world.scheduler.cancel(world.job(job), by="alice")
    world.finish(job, Outcome(OutcomeKind.LOST, message="no exit record"))
    assert (world.state(job), world.job(job).reason) == (JobState.CANCELLED, "cancelled")


def test_a_job_stopped_for_overrunning_ends_failed_overrun(world: World) -> None:
    job = _running(world)
    world.scheduler.store.jobs.set_stop_intent(job, StopIntent.OVERRUN, "used 30 GiB of 8 GiB")
    world.finish(job, Outcome(OutcomeKind.CANCELLED))
    row = world.job(job)
    assert (row.state, row.reason, row.reason_detail) == (
        JobState.FAILED,
        "overrun",
        "used 30 GiB of 8 GiB",
    )


def test_settle_leaves_a_job_that_is_not_running_alone(world: World) -> None:
    queued = world.submit(8 * GiB, held=True)
    _endings(world).settle(queued, Outcome(OutcomeKind.EXIT, exit_code=1))
    assert world.state(queued) == JobState.HELD
    done = _running(world)
    world.finish(done)
    _endings(world).settle(done, Outcome(OutcomeKind.EXIT, exit_code=1))
    assert (world.state(done), world.job(done).exit_code) == (JobState.DONE, 0)


# -- end listeners -------------------------------------------------------------------------------


def test_listeners_hear_whether_hooks_are_due(world: World) -> None:
    heard = _listen(world)
    plain = _running(world)
    hooked = _running(world, notify=("mail", "alice@example.org"))
    world.finish(plain)
    world.finish(hooked)
    assert heard == [(plain, False), (hooked, True)]


def test_a_raising_listener_does_not_undo_the_end(tmp_path: Path) -> None:
    def broken(job_id: int, hooks_due: bool) -> None:
        raise RuntimeError("a listener's bug")

    world = make_world(tmp_path, [24 * GiB], end_listeners=[broken])
    heard = _listen(world)  # the World's, after the broken one: still called
    job = _running(world)
    world.finish(job)
    assert world.state(job) == JobState.DONE
    assert heard == [(job, False)]
    assert [r.state for r in wait_ended(_endings(world), [job], 0.0)] == [JobState.DONE]


# -- adopt_running() (scheduling.adoption): a restarted daemon's running rows ----------------


def _restart(world: World, alive: dict[int, int]) -> FakeLauncher:
    """A new daemon's launcher: only the supervisors in `alive` (job id -> pid) still live."""
    launcher = FakeLauncher(world.root / "logs-after-restart")
    launcher.running.update(alive)
    endings = _endings(world)
    endings.launcher = launcher
    launcher.on_exit = endings.on_job_exit
    return launcher


def test_a_running_job_whose_supervisor_is_gone_ends_lost(world: World) -> None:
    job = _running(world)
    _restart(world, alive={})
    world.scheduler.adopt_running()
    row = world.job(job)
    assert (row.state, row.reason) == (JobState.LOST, "lost")
    assert row.reason_detail is not None and "supervisor was gone" in row.reason_detail


def test_a_gone_supervisor_that_left_an_exit_record_ends_as_it_says(world: World) -> None:
    job = _running(world)
    launcher = _restart(world, alive={})
    launcher.outcomes[job] = Outcome(OutcomeKind.EXIT, exit_code=2)
    world.scheduler.adopt_running()
    assert (world.state(job), world.job(job).exit_code) == (JobState.FAILED, 2)


def test_a_job_still_running_is_re_adopted_and_its_end_seen(world: World) -> None:
    job = _running(world)
    pid = world.job(job).pid
    assert pid is not None
    launcher = _restart(world, alive={job: pid})
    world.scheduler.adopt_running()
    assert world.state(job) == JobState.RUNNING
    launcher.finish(job, Outcome(OutcomeKind.EXIT, exit_code=0))  # watched again
    assert world.state(job) == JobState.DONE


def _marked_running_without_pid(world: World) -> int:
    """A job the previous daemon marked running, dying before its supervisor existed."""
    job = world.submit(8 * GiB)
    store = world.scheduler.store
    assert store.jobs.mark_running(
        job,
        gpu_indices=[0],
        gpu_uuids=[world.probe.uuid(0)],
        pid=None,
        pid_start_time=None,
        log_path=str(world.root / "never-opened.log"),
        now=world.clock().isoformat(),
    )
    return job


def test_a_job_that_never_started_before_the_restart_is_queued_again(world: World) -> None:
    world.scheduler.adopt_running()  # a first run records this boot
    job = _marked_running_without_pid(world)
    _restart(world, alive={})
    world.scheduler.adopt_running()
    assert world.state(job) == JobState.QUEUED


def test_after_a_reboot_a_job_with_no_pid_is_lost_not_run_twice(world: World) -> None:
    job = _marked_running_without_pid(world)  # no boot on record: counts as a reboot
    _restart(world, alive={})
    world.scheduler.adopt_running()
    assert world.state(job) == JobState.LOST
