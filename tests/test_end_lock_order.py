"""A job's end writes its time series before it locks the job's row (issue 26).

The end is one transaction: the job's last timeline points (an `executemany`, which the
PostgreSQL driver sends as a pipeline: a Bind and an Execute per point, one Sync at the
end) and the job's row. A partition between a pipeline's Execute and its Sync leaves its
backend `active`, waiting for the client, holding every lock its transaction took, and no
server bound ends it (not `idle_in_transaction_session_timeout`, not `statement_timeout`);
were the job's row locked by then, every node's pass that touches that row would fail on
it for as long as the backend's TCP peer answers (seen in the randomized fault rounds,
seed 920003). So while the points are in flight, the job's row must not be locked: here
another connection updates that row at that very moment, with a lock timeout.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from gpusched.core.models import JobState
from gpusched.store import Store
from gpusched.store.timeline import TimelineRow, TimelineWrite
from tests.test_store import NOW, new_job, start


def test_a_job_s_end_locks_its_row_only_after_its_time_series(postgres_url: str) -> None:
    store, other = Store(postgres_url), Store(postgres_url)
    try:
        job_id = store.jobs.add(new_job(), NOW).id
        start(store, job_id)
        seen = _probe_while_points_fly(store, other, job_id)
        points = (TimelineRow(1.0, 2**30, 50.0), TimelineRow(2.0, 2**30, 60.0))
        ended = store.jobs.mark_ended(
            job_id,
            state=JobState.DONE,
            reason="exit",
            now="2025-01-01T00:01:00Z",
            exit_code=0,
            timeline=TimelineWrite(points),
        )
        assert seen == ["updated"]
        assert ended and store.jobs.get(job_id).state is JobState.DONE
        assert [p.t for p in store.timeline.timeline_rows(job_id)] == [1.0, 2.0]
    finally:
        store.close()
        other.close()


def _probe_while_points_fly(store: Store, other: Store, job_id: int) -> list[str]:
    """What another connection's update of the job's row met, with a lock timeout, at the
    moment `store` sends the job's timeline points: "updated", or "blocked: ..."."""
    seen: list[str] = []

    def meanwhile(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.lstrip().startswith("INSERT INTO timeline_points") or seen:
            return
        try:  # another node's write of the job's row, while the points are in flight
            with other.database.engine.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '1s'"))
                conn.execute(
                    text("UPDATE jobs SET waiting_reason = 'probe' WHERE id = :id"),
                    {"id": job_id},
                )
            seen.append("updated")
        except OperationalError as exc:
            seen.append(f"blocked: {exc.orig.__class__.__name__}")

    event.listen(store.database.engine, "before_cursor_execute", meanwhile)
    return seen


@pytest.mark.parametrize("first", [JobState.CANCELLED])
def test_an_end_that_loses_keeps_no_points(store: Store, first: JobState) -> None:
    """The first ending wins (the job's row decides): a later one writes nothing, its
    time series included, now that the series is written before the row is asked."""
    job_id = store.jobs.add(new_job(), NOW).id
    start(store, job_id)
    assert store.jobs.mark_ended(job_id, state=first, reason="cancelled", now="t")
    again = store.jobs.mark_ended(
        job_id,
        state=JobState.DONE,
        reason="exit",
        now="t2",
        timeline=TimelineWrite((TimelineRow(1.0, 2**30, 50.0),)),
    )
    assert not again
    assert store.jobs.get(job_id).state is first
    assert store.timeline.timeline_rows(job_id) == []


def test_a_poll_s_figures_lock_the_job_s_row_only_after_its_time_series(
    postgres_url: str,
) -> None:
    """The same for a running job's figures and new points, written at each poll."""
    store, other = Store(postgres_url), Store(postgres_url)
    try:
        job_id = store.jobs.add(new_job(), NOW).id
        start(store, job_id)
        seen = _probe_while_points_fly(store, other, job_id)
        store.usage.set_usage(
            job_id, TimelineWrite((TimelineRow(1.0, 2**30, 50.0),)), peak_mem=2**30
        )
        assert seen == ["updated"]
        assert store.jobs.get(job_id).peak_mem == 2**30
    finally:
        store.close()
        other.close()
