"""The plumbing of "know your jobs": store columns and OOM retries, the retry's place in the
queue, the config keys, and what a sharing job's frameworks are told."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.config.settings import load_config
from gpusched.core.errors import UsageError
from gpusched.core.models import GpuProcess, GpuState, JobState
from gpusched.processes.environment import sharing_environment
from gpusched.scheduling.policy import GpuSlot, WaitingJob, plan
from gpusched.store import NewJob, Store
from gpusched.usage.monitor import Overrun, UsageMonitor

GiB = 2**30
NOW = "2025-01-01T00:00:00.000+00:00"
LATER = "2025-01-01T01:00:00.000+00:00"


def new_job(**overrides: object) -> NewJob:
    values: dict[str, object] = {
        "user": "alice",
        "uid": 1000,
        "gid": 1000,
        "command": ["python", "train.py"],
        "cwd": "/home/alice",
        "env": {"PATH": "/usr/bin"},
        "umask": 0o022,
        "mem": 8 * GiB,
        "priority": 3,
        "retry_oom": 2,
    }
    values.update(overrides)
    return NewJob(**values)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def run_and_end(store: Store, job_id: int, state: JobState = JobState.DONE, **kw: object) -> None:
    assert store.jobs.mark_running(
        job_id,
        gpu_indices=[0],
        gpu_uuids=["GPU-0"],
        pid=42,
        pid_start_time="1",
        log_path="/logs/x.log",
        now=NOW,
    )
    assert store.jobs.mark_ended(job_id, state=state, reason="exit", now=LATER, **kw)  # type: ignore[arg-type]


def test_an_oom_retry_copies_the_spec_keeps_the_place_and_starts_a_new_run(store: Store) -> None:
    first = store.jobs.add(new_job(), NOW)
    store.usage.record_usage(first.id, 9 * GiB)
    store.usage.set_usage(first.id, mean_util=50, hints=["x"], usage_state={"peak_mem": 1})
    retry = store.usage.add_retry(first.id, 12 * GiB)
    assert (retry.state, retry.mem, retry.retry_of, retry.retry_oom) == (
        JobState.QUEUED,
        12 * GiB,
        first.id,
        1,
    )
    assert (retry.command, retry.cwd, retry.priority, retry.submitted_at) == (
        first.command,
        first.cwd,
        first.priority,
        first.submitted_at,
    )
    assert store.jobs.launch_info(retry.id).env == {"PATH": "/usr/bin"}
    assert (retry.peak_mem, retry.mean_util, retry.hints, retry.started_at) == (
        None,
        None,
        [],
        None,
    )
    assert store.usage.usage_state(retry.id) is None
    assert store.jobs.get(first.id).retried_as == retry.id
    # Asking again returns the same retry (a daemon restarted half way does not make two).
    assert store.usage.add_retry(first.id, 12 * GiB).id == retry.id
    assert store.jobs.count() == 2
    # A retry of the retry still points at the first attempt: that is its place.
    assert store.usage.add_retry(retry.id, 18 * GiB).retry_of == first.id
    assert store.jobs.latest_attempts([first.id])[first.id].mem == 18 * GiB


def test_usage_is_written_with_the_end_and_only_usage_columns(store: Store) -> None:
    job = store.jobs.add(new_job(), NOW)
    run_and_end(
        store,
        job.id,
        usage={"peak_mem": 5 * GiB, "mean_util": 40, "util_min": 0, "util_max": 90,
               "util_stddev": 30.5, "hints": ["h"], "overrun_at": NOW},
    )  # fmt: skip
    ended = store.jobs.get(job.id)
    assert (ended.peak_mem, ended.mean_util, ended.util_min, ended.util_max) == (5 * GiB, 40, 0, 90)
    assert (ended.util_stddev, ended.hints, ended.overrun_at) == (30.5, ["h"], NOW)
    with pytest.raises(ValueError, match="not a usage column"):
        store.usage.set_usage(job.id, state="done")


def test_peaks_for_command_counts_the_owners_successful_runs_of_that_command(
    store: Store,
) -> None:
    def job(peak: int, state: JobState = JobState.DONE, **kw: object) -> int:
        job_id = store.jobs.add(new_job(**kw), NOW).id
        store.usage.record_usage(job_id, peak)
        run_and_end(store, job_id, state)
        return job_id

    good = [job(5 * GiB), job(6 * GiB)]
    job(20 * GiB, JobState.FAILED)
    job(30 * GiB, command=["python", "other.py"])
    job(40 * GiB, uid=1001)
    runs = store.usage.peaks_for_command(1000, ["python", "train.py"])
    assert sorted(run[0] for run in runs) == good
    assert max(run[1] for run in runs) == 6 * GiB
    assert store.usage.peaks_for_command(1000, ["python"]) == []


def test_an_oom_retry_goes_before_jobs_submitted_after_its_first_attempt() -> None:
    gpus = [GpuSlot("GPU-0", 0, 24 * GiB, 24 * GiB)]
    waiting = [
        WaitingJob(5, 20 * GiB),  # submitted after job 3 first was
        WaitingJob(9, 20 * GiB, queue_order=3),  # job 3's retry
    ]
    result = plan(gpus, [], waiting, headroom_bytes=0)
    assert [p.job_id for p in result.placements] == [9]
    # Without its first attempt's place it would wait behind job 5.
    waiting[1] = WaitingJob(9, 20 * GiB)
    assert [p.job_id for p in plan(gpus, [], waiting, headroom_bytes=0).placements] == [5]
    # Priority still comes first.
    waiting = [WaitingJob(5, 20 * GiB, priority=1), WaitingJob(9, 20 * GiB, queue_order=3)]
    assert [p.job_id for p in plan(gpus, [], waiting, headroom_bytes=0).placements] == [5]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("overrun: kill\noverrun_margin: 25%\n", ("kill", 0.25, 0, 120.0)),
        ("overrun_margin: 1G\nhint_min_runtime: 30s\n", ("warn", 0.0, GiB, 30.0)),
        ("overrun_margin: 0\nhint_min_runtime: 0\n", ("warn", 0.0, 0, 0.0)),
        ("", ("warn", 0.10, 0, 120.0)),
    ],
)
def test_config_keys(tmp_path: Path, text: str, expected: tuple[object, ...]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    config = load_config(path)
    got = (
        config.overrun,
        config.overrun_margin_fraction,
        config.overrun_margin_bytes,
        config.hint_min_runtime_s,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("overrun: stop\n", "key 'overrun': expected 'warn' or 'kill'"),
        ("overrun_margin: lots%\n", "key 'overrun_margin': expected a percentage"),
        ("overrun_margin: -5%\n", "key 'overrun_margin': expected a percentage between"),
        ("hint_min_runtime: soon\n", "key 'hint_min_runtime': invalid duration"),
    ],
)
def test_bad_config_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_config(path)


def test_frameworks_are_told_the_share_of_a_shared_card_unless_the_user_said() -> None:
    assert sharing_environment(10 * GiB, [24 * GiB], {}) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.41",  # 0.4166..., rounded down
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    # The smallest card of a multi-GPU job decides; never below 0.01 or above 1.
    assert (
        sharing_environment(8 * GiB, [80 * GiB, 16 * GiB], {})["XLA_PYTHON_CLIENT_MEM_FRACTION"]
        == "0.50"
    )
    assert sharing_environment(1, [80 * GiB], {})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.01"
    assert sharing_environment(23 * GiB, [23 * GiB], {})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.00"
    users = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "TF_FORCE_GPU_ALLOW_GROWTH": "false"}
    assert sharing_environment(10 * GiB, [24 * GiB], users) == {}
    assert sharing_environment(None, [24 * GiB], {}) == {}  # a whole GPU: nothing to share


def test_the_monitor_samples_flushes_once_a_minute_and_survives_a_restart(store: Store) -> None:
    job = store.jobs.add(new_job(mem=4 * GiB), NOW)
    assert store.jobs.mark_running(
        job.id, gpu_indices=[0], gpu_uuids=["GPU-0"], pid=os.getpid(), pid_start_time="1",
        log_path="/nonexistent.log", now=NOW,
    )  # fmt: skip
    job = store.jobs.get(job.id)
    me = os.getpid()

    def poll(monitor: UsageMonitor, at_s: float, used: int, util: int) -> list[Overrun]:
        gpu = GpuState(0, "GPU-0", "card", 24 * GiB, used, 24 * GiB - used, util,
                       processes=(GpuProcess(me, used),))  # fmt: skip
        return monitor.observe(
            now_s=at_s,
            now_iso=f"t{at_s}",
            gpus=[gpu],
            running=[job],
            processes={job.id: {"GPU-0": list(gpu.processes)}},
            process_util={"GPU-0": {me: util}},
            margin_fraction=0.10,
            margin_bytes=0,
        )

    monitor = UsageMonitor(store.usage, store.timeline, flush_interval_s=60)
    assert poll(monitor, 0, 3 * GiB, 20) == []
    assert poll(monitor, 30, 3 * GiB, 40) == []
    assert store.usage.usage_state(job.id) is None  # no write per poll
    [over] = poll(monitor, 61, 5 * GiB, 60)  # over 4G + 10%, and a minute on: flushed
    assert (over.job.id, over.used_bytes, over.limit_bytes) == (
        job.id,
        5 * GiB,
        4 * GiB + 429496729,
    )
    assert poll(monitor, 62, 5 * GiB, 60) == []  # told once
    assert store.jobs.get(job.id).mean_util == 40
    # A new daemon picks the figures up from the last flush and carries on.
    restarted = UsageMonitor(store.usage, store.timeline)
    poll(restarted, 100, 2 * GiB, 100)
    tracker = restarted.finish(job)
    assert (tracker.util_samples, tracker.util_min, tracker.util_max) == (4, 20, 100)
    assert tracker.peak_mem == 5 * GiB
    assert tracker.overrun_at == "t61"


def test_a_job_stopped_before_its_first_poll_writes_valid_json(store: Store) -> None:
    """PostgreSQL's JSON has no NaN: a timeline that has not started yet must not send one
    (the stopping daemon's last write failed there)."""
    job = store.jobs.add(new_job(), NOW)
    monitor = UsageMonitor(store.usage, store.timeline)
    monitor.started(job)
    monitor.flush_all()
    state = store.usage.usage_state(job.id)
    assert state is not None
    json.dumps(state, allow_nan=False)
    restarted = UsageMonitor(store.usage, store.timeline)
    assert restarted.timeline(store.jobs.get(job.id)).snapshot() == []
