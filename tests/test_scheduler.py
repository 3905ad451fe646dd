"""The scheduler's wait_until_ended (scheduler.endings) against a real store: it sees every
ending, however many end.

A waiter re-reads the database only when one of its jobs may have ended (the scheduler
remembers the ids of the latest endings); when more ended than it remembers, it reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.models import EndReason, Job, JobState
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import NewJob
from tests.daemon_harness import in_process_scheduler


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    made = in_process_scheduler(tmp_path, "1x24G", kill_grace="1s")
    yield made
    made.context.launcher.close()
    made.store.close()


def wait_ended(endings: JobEndings, job_ids: list[int], timeout_s: float) -> list[Job]:
    """What the daemon's `wait` does: block until every job has ended or the timeout
    passes, then read their rows (an unknown id is left out)."""
    endings.wait_until_ended(job_ids, timeout_s)
    found = endings.jobs.get_many(job_ids)
    return [found[i] for i in job_ids if i in found]


def _queue(scheduler: Scheduler, n: int) -> list[int]:
    new = NewJob(
        user="alice", uid=1000, gid=1000, command=["true"], cwd="/", env={}, umask=18, mem=None
    )
    return [job.id for job in scheduler.store.jobs.add_many([new] * n, "t", as_array=False)]


@pytest.mark.parametrize("others", [10, 3000])  # fewer, and more, than it remembers
def test_wait_sees_its_jobs_end_among_many_others(scheduler: Scheduler, others: int) -> None:
    ids = _queue(scheduler, others + 3)
    mine = [ids[5], ids[-1], ids[len(ids) // 2]]

    def end_all() -> None:
        time.sleep(0.2)  # the waiter is waiting by now
        # All end before the waiter runs again (as when it is starved of CPU): it must
        # notice that it missed some.
        with scheduler.endings.ended:
            for job_id in ids:
                scheduler.endings.end(
                    job_id, JobState.CANCELLED, EndReason.CANCELLED, detail="test"
                )

    ender = threading.Thread(target=end_all)
    ender.start()
    began = time.monotonic()
    # Woken by the endings, not the timeout: far longer than ending them takes on a loaded
    # machine (a minute and more for 3000 on two busy cores), so no race with it.
    jobs = wait_ended(scheduler.endings, mine, timeout_s=600)
    ender.join()
    assert time.monotonic() - began < 500
    assert [j.id for j in jobs] == mine
    assert all(j.state == JobState.CANCELLED for j in jobs), jobs


def test_wait_returns_at_the_timeout_with_jobs_still_queued(scheduler: Scheduler) -> None:
    ids = _queue(scheduler, 2)
    scheduler.endings.end(ids[0], JobState.CANCELLED, EndReason.CANCELLED, detail="test")
    began = time.monotonic()
    jobs = wait_ended(scheduler.endings, ids, timeout_s=0.3)
    assert 0.25 < time.monotonic() - began < 5
    assert [j.state for j in jobs] == [JobState.CANCELLED, JobState.QUEUED]
