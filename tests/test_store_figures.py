"""store.jobs.job_figures on a real SQLite file and a real PostgreSQL server: the counts and
queue waits the metrics report."""

from __future__ import annotations

from sqlalchemy import text

from gpusched.core.models import EndReason, JobState
from gpusched.store import JobFigures, Store
from tests.test_store import new_job, start

T0 = "2025-01-01T00:00:00+00:00"


def at(seconds: int) -> str:
    return f"2025-01-01T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}+00:00"


def test_an_empty_database_has_no_figures(store: Store) -> None:
    assert store.jobs.job_figures() == JobFigures({}, {}, [])


def test_counts_by_state_and_user_and_ended_by_reason(store: Store) -> None:
    alice = [store.jobs.add(new_job(), T0).id for _ in range(4)]
    bob = [store.jobs.add(new_job(user="bob", uid=1001), T0).id for _ in range(2)]
    assert start(store, alice[0], now=at(30))
    assert start(store, alice[1], now=at(60))
    store.jobs.mark_ended(alice[1], state=JobState.DONE, reason=str(EndReason.EXIT), now=at(90))
    assert store.jobs.hold(alice[2])
    store.jobs.mark_ended(bob[0], state=JobState.CANCELLED, reason=str(EndReason.CANCELLED), now=T0)
    assert start(store, bob[1], now=at(3600))
    store.jobs.mark_ended(bob[1], state=JobState.FAILED, reason=str(EndReason.OOM), now=at(3700))

    figures = store.jobs.job_figures()

    assert figures.by_state_and_user == {
        (JobState.RUNNING, "alice"): 1,
        (JobState.DONE, "alice"): 1,
        (JobState.HELD, "alice"): 1,
        (JobState.QUEUED, "alice"): 1,
        (JobState.CANCELLED, "bob"): 1,
        (JobState.FAILED, "bob"): 1,
    }
    assert all(isinstance(state, JobState) for state, _ in figures.by_state_and_user)
    # Ended jobs only: the running, held and queued ones have no reason to count.
    assert figures.ended_by_reason == {"exit": 1, "cancelled": 1, "oom": 1}
    # Every job that started, ended or not, in id order; the one cancelled while queued never
    # waited its way to a start.
    assert figures.queue_waits_s == [30.0, 60.0, 3600.0]


def test_figures_survive_a_reopen(store: Store, database_url: str) -> None:
    job = store.jobs.add(new_job(), T0).id
    assert start(store, job, now=at(5))
    store.jobs.mark_ended(job, state=JobState.DONE, reason=str(EndReason.EXIT), now=at(9))
    before = store.jobs.job_figures()
    store.close()
    again = Store(database_url)
    try:
        assert again.jobs.job_figures() == before
        assert before.queue_waits_s == [5.0]
    finally:
        again.close()


def test_a_row_whose_times_do_not_parse_is_left_out_of_the_waits(store: Store) -> None:
    good, bad = store.jobs.add(new_job(), T0).id, store.jobs.add(new_job(), T0).id
    assert start(store, good, now=at(12))
    assert start(store, bad, now=at(12))
    # A row written by hand (or by an older version) with a time that is not ISO 8601.
    with store.database.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET submitted_at = 'yesterday' WHERE id = :id"), {"id": bad})

    figures = store.jobs.job_figures()

    assert figures.queue_waits_s == [12.0]
    assert figures.by_state_and_user == {(JobState.RUNNING, "alice"): 2}
