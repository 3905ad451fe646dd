"""Each job's memory and utilization over time: the downsampling (gpusched.usage.timeline),
the `timeline` table (gpusched.store.timeline), and how the usage monitor feeds and
flushes it: bounded however long a job runs, the peak kept, written in batches, picked
up after a restart, and deleted with its job."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from sqlalchemy import delete, event, func, select

from gpusched.core.models import GpuProcess, GpuState, Job, JobState, TimelinePoint
from gpusched.store import NewJob, Store, jobs, timeline_points
from gpusched.usage.monitor import UsageMonitor
from gpusched.usage.timeline import (
    COARSE_S,
    FINE_WINDOW_S,
    MAX_POINTS,
    TimelineBuffer,
)

GiB = 2**30
NOW = "2025-01-01T00:00:00.000+00:00"
START_S = 1_735_689_600.0  # NOW in epoch seconds
HOUR = 3600.0


def running_job(store: Store, **spec: Any) -> Job:
    values: dict[str, Any] = {
        "user": "alice", "uid": 1000, "gid": 1000, "command": ["python", "train.py"],
        "cwd": "/home/alice", "env": {}, "umask": 0o022, "mem": 16 * GiB, **spec,
    }  # fmt: skip
    job = store.jobs.add(NewJob(**values), NOW)
    assert store.jobs.mark_running(
        job.id, gpu_indices=[0], gpu_uuids=["GPU-0"], pid=os.getpid(), pid_start_time="1",
        log_path="/nonexistent.log", now=NOW,
    )  # fmt: skip
    return store.jobs.get(job.id)


def memory_at(age_s: float) -> int:
    """A training run: climbs for ten minutes, then holds 10G, with one 7G spike at hour 50."""
    if 50 * HOUR <= age_s < 50 * HOUR + 2:
        return 17 * GiB
    return int(min(1.0, age_s / 600) * 10 * GiB)


def util_at(age_s: float) -> float:
    return 90.0 if int(age_s // 30) % 2 else 10.0  # waits for data every other half minute


def test_a_72_hour_job_keeps_at_most_1000_points_its_peak_and_its_shape(store: Store) -> None:
    """Polls every 2 s through the buffer, flushed to the store once a minute (simulated)."""
    job = running_job(store)
    buffer = TimelineBuffer(START_S)
    flushes, most_stored = 0, 0
    age = 0.0
    while age <= 72 * HOUR:
        buffer.add(START_S + age, memory_at(age), util_at(age))
        if age % 60 == 0:
            write = buffer.pending()
            if write is not None:
                store.usage.set_usage(job.id, timeline=write)
                buffer.committed(write)
                flushes += 1
        if age % 3600 == 0:
            most_stored = max(most_stored, len(store.timeline.timeline_rows(job.id)))
        assert len(buffer.points) <= MAX_POINTS
        age += 2
    assert store.jobs.mark_ended(
        job.id, state=JobState.DONE, reason="exit", now=NOW, timeline=buffer.pending(final=True)
    )
    points = store.timeline.job_timeline(job.id)
    assert most_stored <= MAX_POINTS
    assert 250 <= len(points) <= MAX_POINTS
    assert points == buffer.snapshot()  # the store holds all of it, the last point too
    assert [p.t for p in points] == sorted(p.t for p in points)
    assert points[0].t == START_S
    assert points[-1].t > START_S + 71 * HOUR
    # The 2-second spike survives every merge, at the right time.
    [spike] = [p for p in points if p.memory_bytes == 17 * GiB]
    assert spike.t <= START_S + 50 * HOUR < spike.t + 2 * 3600 * 72 / len(points)
    # The shape: the climb at the start, the plateau after, utilization between its bounds.
    climb = [p.memory_bytes or 0 for p in points[:3]]
    assert climb == sorted(climb)
    assert climb[0] < 10 * GiB
    assert sum(p.memory_bytes == 10 * GiB for p in points) > len(points) * 0.9
    assert all(p.utilization_pct is not None and 10 <= p.utilization_pct <= 90 for p in points)
    mean_util = sum(p.utilization_pct or 0 for p in points[len(points) // 2 :]) * 2 / len(points)
    assert 45 <= mean_util <= 55  # buckets of whole minutes average the swings to their mean
    assert flushes < 72 * 60 + 1  # one write per flush at most, never one per poll


def test_one_point_per_poll_first_then_per_minute_then_wider() -> None:
    buffer = TimelineBuffer(START_S)
    for age in range(0, 3 * 3600, 2):
        buffer.add(START_S + age, GiB, 50.0)
    times = [p.t - START_S for p in buffer.points]
    fine = [t for t in times if t < FINE_WINDOW_S]
    assert fine == list(range(0, int(FINE_WINDOW_S), 2))  # every poll of the first minutes
    coarse = [t for t in times if t >= FINE_WINDOW_S]
    assert all(b - a == COARSE_S for a, b in itertools.pairwise(coarse))  # then one a minute
    assert sum(p.samples for p in buffer.points) == 3 * 3600 // 2  # no poll lost
    # Past the cap, everything is merged into wider buckets, the first minutes too.
    small = TimelineBuffer(START_S, max_points=100)
    for age in range(0, 3 * 3600, 2):
        small.add(START_S + age, GiB + age, 50.0)
    assert 50 <= len(small.points) <= 100
    assert small.width_s > COARSE_S
    assert small.points[-1].memory_bytes == GiB + 3 * 3600 - 2  # the latest high kept
    assert sum(p.samples for p in small.points) == 3 * 3600 // 2


def test_fast_polls_are_thinned_before_the_first_minutes_end() -> None:
    buffer = TimelineBuffer(START_S, max_points=100)
    for i in range(1000):  # a poll every 0.1 s
        buffer.add(START_S + i / 10, i, None)
    assert len(buffer.points) <= 100
    assert max(p.memory_bytes or 0 for p in buffer.points) == 999
    assert all(p.utilization_pct is None for p in buffer.points)


def test_writes_append_closed_points_and_replace_once_after_thinning(store: Store) -> None:
    job = running_job(store)
    buffer = TimelineBuffer(START_S, max_points=10)
    for age in range(6):
        buffer.add(START_S + age, age * GiB, 50.0)
    write = buffer.pending()
    assert write is not None
    assert (len(write.points), write.replace) == (5, False)  # the last is still filling
    store.usage.set_usage(job.id, timeline=write)
    buffer.committed(write)
    assert buffer.pending() is None  # nothing new
    for age in range(6, 20):  # past 10 points: thinned, the stored ones are stale
        buffer.add(START_S + age, age * GiB, 50.0)
    write = buffer.pending()
    assert write is not None
    assert write.replace
    store.usage.set_usage(job.id, timeline=write)
    buffer.committed(write)
    final = buffer.pending(final=True)
    assert final is not None
    assert not final.replace
    store.usage.set_usage(job.id, timeline=final)
    buffer.committed(final)
    assert store.timeline.job_timeline(job.id) == buffer.snapshot()
    assert max(p.memory_bytes or 0 for p in store.timeline.job_timeline(job.id)) == 19 * GiB


def test_the_monitor_writes_points_with_its_flush_and_the_end_and_survives_a_restart(
    store: Store,
) -> None:
    job = running_job(store, mem=4 * GiB, gpus=2)
    me = os.getpid()
    commits: list[int] = []
    event.listen(store.database.engine, "commit", lambda _conn: commits.append(1))

    def poll(monitor: UsageMonitor, age: float, used: int, util: int) -> None:
        gpus = [
            GpuState(i, f"GPU-{i}", "card", 24 * GiB, used, 24 * GiB - used, util,
                     processes=(GpuProcess(me, used),))
            for i in (0, 1)
        ]  # fmt: skip
        monitor.observe(
            now_s=START_S + age,
            now_iso=f"t{age}",
            gpus=gpus,
            running=[job],
            processes={job.id: {g.uuid: list(g.processes) for g in gpus}},
            process_util={g.uuid: {me: util} for g in gpus},
            margin_fraction=0.10,
            margin_bytes=2 * GiB,
        )

    monitor = UsageMonitor(store.usage, store.timeline, flush_interval_s=60)
    monitor.started(job)
    for age in range(0, 120, 2):
        poll(monitor, age, 3 * GiB, 40)
    # 60 polls, two writes: the peak when it rose (at the first), the flush a minute in.
    assert len(commits) == 2
    stored = store.timeline.job_timeline(job.id)
    assert len(stored) == 30  # the polls before the flush; the flush's own is still open
    assert stored[0] == TimelinePoint(START_S, 6 * GiB, 40.0)  # summed over both GPUs
    live = monitor.live_timeline(job.id)
    assert live is not None
    assert len(live) == 60
    # A new daemon picks the series up where the store has it and carries on.
    restarted = UsageMonitor(store.usage, store.timeline, flush_interval_s=60)
    for age in range(420, 480, 2):  # past the first five minutes: one point a minute
        poll(restarted, age, 4 * GiB, 80)
    final = restarted.final_timeline(job.id)
    assert store.jobs.mark_ended(
        job.id, state=JobState.DONE, reason="exit", now=NOW, timeline=final
    )
    points = store.timeline.job_timeline(job.id)
    assert points[:30] == stored
    assert points[30:] == [TimelinePoint(START_S + 420, 8 * GiB, 80.0)]
    assert [p.t for p in points] == sorted({p.t for p in points})


def test_points_go_with_their_job_and_the_table_is_added_to_an_older_database(
    db_path: Path,
) -> None:
    store = Store(f"sqlite:///{db_path}")
    try:
        kept, dropped = running_job(store), running_job(store)
        buffer = TimelineBuffer(START_S)
        for age in range(5):
            buffer.add(START_S + age, GiB, 1.0)
        for job in (kept, dropped):
            store.usage.set_usage(job.id, timeline=buffer.pending(final=True))
        with store.database.engine.begin() as conn:  # history pruned: the job's row deleted
            conn.execute(delete(jobs).where(jobs.c.id == dropped.id))
            left = conn.execute(
                select(timeline_points.c.job_id, func.count()).group_by("job_id")
            ).all()
        assert [tuple(row) for row in left] == [(kept.id, 5)]
        assert store.timeline.job_timeline(dropped.id) == []
        with store.database.engine.begin() as conn:  # a database from before the timeline (and
            conn.exec_driver_sql("DROP TABLE timeline_points")  # before schema revisions)
            conn.exec_driver_sql("DROP TABLE alembic_version")
    finally:
        store.close()
    reopened = Store(f"sqlite:///{db_path}")
    try:
        assert reopened.timeline.job_timeline(kept.id) == []
        reopened.usage.set_usage(kept.id, timeline=buffer.pending(final=True))
        assert len(reopened.timeline.job_timeline(kept.id)) == 5
    finally:
        reopened.close()


def test_timeline_points_as_json_round_trip() -> None:
    point = TimelinePoint(START_S + 0.25, 3 * GiB, 42.5)
    data = point.to_json()
    assert data == {"t": "2025-01-01T00:00:00.250+00:00", "memory": 3 * GiB, "util": 42.5}
    assert TimelinePoint.from_json(data) == point
    empty = TimelinePoint.from_json({"t": "2025-01-01T00:00:00.000+00:00", "memory": None})
    assert empty == TimelinePoint(START_S, None, None)
