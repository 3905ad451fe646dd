"""The job store on a real SQLite file and a real PostgreSQL server (the `store` and
`database_url` fixtures run each test on both): transitions are compare-and-set, restarts
keep the queue. The tests of SQLite's file itself (WAL, mode, fsyncs) take `db_path`."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpusched.core.errors import NotFoundError
from gpusched.core.models import EndReason, JobState, StopIntent
from gpusched.store import LaunchInfo, NewJob, Store

NOW = "2025-01-01T00:00:00+00:00"


def new_job(**overrides: object) -> NewJob:
    values: dict[str, object] = {
        "user": "alice",
        "uid": 1000,
        "gid": 1000,
        "command": ["python", "train.py", "--lr", "3e-4"],
        "cwd": "/home/alice/project",
        "env": {"PATH": "/usr/bin", "LANG": "C.UTF-8"},
        "umask": 0o022,
        "mem": 8 * 2**30,
    }
    values.update(overrides)
    return NewJob(**values)  # type: ignore[arg-type]


def start(store: Store, job_id: int, now: str = NOW) -> bool:
    return store.jobs.mark_running(
        job_id,
        gpu_indices=[1],
        gpu_uuids=["GPU-1"],
        pid=4242,
        pid_start_time="12345",
        log_path=f"/logs/{job_id}.log",
        now=now,
    )


def end(store: Store, job_id: int, now: str = NOW, **kw: object) -> bool:
    values: dict[str, object] = {"state": JobState.DONE, "reason": str(EndReason.EXIT)}
    values.update(kw)
    return store.jobs.mark_ended(job_id, now=now, **values)  # type: ignore[arg-type]


# -- add and read ----------------------------------------------------------------------------


def test_add_stores_every_field(store: Store) -> None:
    job = store.jobs.add(
        new_job(name="train", priority=5, after=(7, 9), gpus=2, mem=None), "2025-01-01T00:00:01Z"
    )
    assert job.id >= 1
    assert job.state is JobState.QUEUED
    assert job.name == "train"
    assert job.user == "alice"
    assert job.uid == 1000
    assert job.command == ["python", "train.py", "--lr", "3e-4"]
    assert job.cwd == "/home/alice/project"
    assert job.mem is None
    assert job.gpus == 2
    assert job.priority == 5
    assert job.after == [7, 9]
    assert job.submitted_at == "2025-01-01T00:00:01Z"
    assert job.gpu_indices == []
    assert job.gpu_uuids == []
    assert job.hints == []
    assert (job.started_at, job.ended_at, job.pid, job.exit_code, job.reason) == (None,) * 5
    assert store.jobs.get(job.id) == job


def test_add_held(store: Store) -> None:
    job = store.jobs.add(new_job(held=True), NOW)
    assert job.state is JobState.HELD
    assert store.jobs.get(job.id).state is JobState.HELD


def test_ids_increase(store: Store) -> None:
    ids = [store.jobs.add(new_job(), NOW).id for _ in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert store.jobs.count() == 5


def test_large_sizes_survive(store: Store) -> None:
    job = store.jobs.add(new_job(mem=80 * 2**30), NOW)
    assert store.jobs.get(job.id).mem == 80 * 2**30


def test_unknown_id(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no job 99"):
        store.jobs.get(99)
    with pytest.raises(NotFoundError):
        store.jobs.launch_info(99)


def test_get_many(store: Store) -> None:
    a = store.jobs.add(new_job(name="a"), NOW)
    b = store.jobs.add(new_job(name="b"), NOW)
    got = store.jobs.get_many([b.id, a.id, 1234])
    assert set(got) == {a.id, b.id}
    assert got[a.id].name == "a"
    assert got[b.id].name == "b"
    assert store.jobs.get_many([]) == {}


def test_active_in_submit_order(store: Store) -> None:
    queued = store.jobs.add(new_job(), NOW).id
    held = store.jobs.add(new_job(held=True), NOW).id
    running = store.jobs.add(new_job(), NOW).id
    done = store.jobs.add(new_job(), NOW).id
    assert start(store, running)
    assert start(store, done)
    assert end(store, done)
    active = store.jobs.active()
    assert [j.id for j in active] == [queued, held, running]
    assert [j.state for j in active] == [JobState.QUEUED, JobState.HELD, JobState.RUNNING]


def test_ended_most_recent_first_with_limit_and_user(store: Store) -> None:
    ids = [store.jobs.add(new_job(user="bob" if i % 2 else "alice"), NOW).id for i in range(4)]
    end(store, ids[0], now="2025-01-01T00:00:03Z")
    end(store, ids[1], now="2025-01-01T00:00:01Z")
    end(store, ids[2], now="2025-01-01T00:00:02Z", state=JobState.CANCELLED, reason="cancelled")
    end(store, ids[3], now="2025-01-01T00:00:02Z", state=JobState.FAILED, exit_code=1)
    store.jobs.add(new_job(), NOW)  # still queued: never in ended()
    assert [j.id for j in store.jobs.ended(10)] == [ids[0], ids[3], ids[2], ids[1]]
    assert [j.id for j in store.jobs.ended(2)] == [ids[0], ids[3]]
    assert [j.id for j in store.jobs.ended(10, user="bob")] == [ids[3], ids[1]]
    assert store.jobs.ended(10, user="carol") == []


# -- transitions -----------------------------------------------------------------------------


def test_ended_by_state_and_since(store: Store) -> None:
    ids = [store.jobs.add(new_job(), NOW).id for _ in range(4)]
    endings = [
        (JobState.DONE, "2026-11-21T10:00:00.000+00:00"),
        (JobState.FAILED, "2026-11-21T11:00:00.000+00:00"),
        (JobState.FAILED, "2026-11-21T12:00:00.500+00:00"),
        (JobState.LOST, "2026-11-21T12:00:00.000+00:00"),
    ]
    for job_id, (state, when) in zip(ids, endings, strict=True):
        start(store, job_id)
        end(store, job_id, now=when, state=state)
    failed = store.jobs.ended(10, states=[JobState.FAILED])
    assert [j.id for j in failed] == [ids[2], ids[1]]
    since = store.jobs.ended(10, since="2026-11-21T11:00:00.000+00:00")  # at or after
    assert [j.id for j in since] == [ids[2], ids[3], ids[1]]
    both = store.jobs.ended(
        10, states=[JobState.FAILED, JobState.LOST], since="2026-11-21T12:00:00.000+00:00"
    )
    assert [j.id for j in both] == [ids[2], ids[3]]
    # Active states are never "ended", whatever is asked.
    assert store.jobs.ended(10, states=[JobState.QUEUED, JobState.RUNNING]) == []


def test_mark_running_records_the_launch(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    assert start(store, job_id, now="2025-01-01T00:00:05Z")
    job = store.jobs.get(job_id)
    assert job.state is JobState.RUNNING
    assert job.gpu_indices == [1]
    assert job.gpu_uuids == ["GPU-1"]
    assert job.pid == 4242
    assert job.log_path == f"/logs/{job_id}.log"
    assert job.started_at == "2025-01-01T00:00:05Z"
    assert store.jobs.launch_info(job_id).pid_start_time == "12345"


def test_mark_running_is_compare_and_set(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    assert start(store, job_id, now="first")
    assert not start(store, job_id, now="second")  # already running
    assert store.jobs.get(job_id).started_at == "first"


@pytest.mark.parametrize("state", [JobState.HELD, JobState.DONE, JobState.CANCELLED])
def test_mark_running_only_from_queued(store: Store, state: JobState) -> None:
    job_id = store.jobs.add(new_job(held=True), NOW).id
    if state is not JobState.HELD:
        end(store, job_id, state=state)
    assert not start(store, job_id)
    job = store.jobs.get(job_id)
    assert job.state is state
    assert job.pid is None
    assert job.started_at is None


def test_mark_running_unknown_id(store: Store) -> None:
    assert not start(store, 12345)


@pytest.mark.parametrize("how", ["queued", "held", "running"])
def test_mark_ended_from_every_active_state(store: Store, how: str) -> None:
    job_id = store.jobs.add(new_job(held=how == "held"), NOW).id
    if how == "running":
        start(store, job_id)
    assert store.jobs.mark_ended(
        job_id,
        state=JobState.FAILED,
        reason=str(EndReason.SIGNAL),
        now="2025-01-01T00:01:00Z",
        exit_code=-9,
        detail="killed by SIGKILL",
        log_path="/logs/new.log",
    )
    job = store.jobs.get(job_id)
    assert job.state is JobState.FAILED
    assert job.reason == "signal"
    assert job.exit_code == -9
    assert job.reason_detail == "killed by SIGKILL"
    assert job.ended_at == "2025-01-01T00:01:00Z"
    assert job.log_path == "/logs/new.log"


def test_first_ending_wins(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    start(store, job_id)
    assert end(store, job_id, now="t1", exit_code=0)
    assert not end(store, job_id, now="t2", state=JobState.CANCELLED, reason="cancelled")
    job = store.jobs.get(job_id)
    assert job.state is JobState.DONE
    assert job.reason == "exit"
    assert job.exit_code == 0
    assert job.ended_at == "t1"
    assert job.log_path == f"/logs/{job_id}.log"  # not replaced by the losing end


def test_mark_ended_without_log_path_keeps_it(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    start(store, job_id)
    end(store, job_id)
    assert store.jobs.get(job_id).log_path == f"/logs/{job_id}.log"


def test_hooks_due_from_the_end_until_they_start(store: Store) -> None:
    with_hooks = store.jobs.add(new_job(notify=("mail", "alice@lab.org")), NOW).id
    without = store.jobs.add(new_job(), NOW).id
    later = store.jobs.add(new_job(), NOW).id
    assert store.jobs.get(with_hooks).notify == ["mail", "alice@lab.org"]
    assert store.jobs.get(without).notify is None
    for job_id, hooks_due, now in (
        (later, True, "t2"),
        (with_hooks, True, "t1"),
        (without, False, "t1"),
    ):
        start(store, job_id)
        end(store, job_id, now=now, hooks_due=hooks_due)
    assert store.jobs.hooks_due() == [with_hooks, later]  # in the order they ended
    store.jobs.hooks_started(with_hooks)
    assert store.jobs.hooks_due() == [later]
    # A second ending is refused, and cannot mark the hooks due again.
    assert not end(store, with_hooks, hooks_due=True)
    assert store.jobs.hooks_due() == [later]


def test_hold_and_release(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    assert store.jobs.hold(job_id)
    assert store.jobs.get(job_id).state is JobState.HELD
    assert not store.jobs.hold(job_id)
    assert store.jobs.release(job_id)
    assert store.jobs.get(job_id).state is JobState.QUEUED
    assert not store.jobs.release(job_id)


def test_hold_and_release_do_not_touch_running_or_ended_jobs(store: Store) -> None:
    running = store.jobs.add(new_job(), NOW).id
    start(store, running)
    ended = store.jobs.add(new_job(), NOW).id
    end(store, ended)
    for job_id, state in ((running, JobState.RUNNING), (ended, JobState.DONE)):
        assert not store.jobs.hold(job_id)
        assert not store.jobs.release(job_id)
        assert store.jobs.get(job_id).state is state


def test_launch_info(store: Store) -> None:
    env = {"PATH": "/opt/conda/bin:/usr/bin", "ODD": "é ü \u2603", "EMPTY": ""}
    job_id = store.jobs.add(new_job(gid=2000, env=env, umask=0o077), NOW).id
    assert store.jobs.launch_info(job_id) == LaunchInfo(2000, env, 0o077, None)
    assert "env" not in store.jobs.get(job_id).to_json()  # never sent to clients


def test_set_pid(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    start(store, job_id)
    assert store.jobs.set_pid(job_id, 777, "999.5")
    assert store.jobs.get(job_id).pid == 777
    assert store.jobs.launch_info(job_id).pid_start_time == "999.5"


def test_writes_about_a_running_job_are_refused_once_it_has_ended(store: Store) -> None:
    """pid and stop intent (with its detail) are conditional writes, like every state
    change: a late one (another daemon's, or a thread's that lost a race) changes nothing."""
    job_id = store.jobs.add(new_job(), NOW).id
    assert not store.jobs.set_pid(job_id, 1, "1.0")  # queued: no supervisor to record
    assert not store.jobs.set_stop_intent(job_id, StopIntent.CANCEL, "too early")
    start(store, job_id)
    assert store.jobs.set_stop_intent(job_id, StopIntent.CANCEL, "cancelled by alice")
    end(store, job_id, state=JobState.CANCELLED, reason="cancelled", detail="cancelled by alice")
    assert not store.jobs.set_pid(job_id, 777, "999.5")
    assert not store.jobs.set_stop_intent(job_id, StopIntent.OVERRUN, "late")
    job = store.jobs.get(job_id)
    assert (job.pid, job.reason_detail) == (4242, "cancelled by alice")
    assert store.jobs.launch_info(job_id).stop_intent is StopIntent.CANCEL


def test_record_usage(store: Store) -> None:
    job_id = store.jobs.add(new_job(), NOW).id
    store.usage.record_usage(job_id, 3 * 2**30)
    assert store.jobs.get(job_id).peak_mem == 3 * 2**30


# -- the file ---------------------------------------------------------------------------------


def test_wal_mode_on_the_file(db_path: Path) -> None:
    store = Store(f"sqlite:///{db_path}")
    store.jobs.add(new_job(), NOW)
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()
        store.close()


def test_creates_parent_directory_and_private_file(db_path: Path) -> None:
    assert not db_path.parent.exists()
    s = Store(f"sqlite:///{db_path}")
    try:
        assert db_path.exists()
        assert db_path.stat().st_mode & 0o077 == 0
    finally:
        s.close()


def test_reopened_store_sees_everything(database_url: str) -> None:
    url = database_url
    first = Store(url)
    queued = first.jobs.add(new_job(name="q", priority=3), NOW).id
    held = first.jobs.add(new_job(name="h", held=True), NOW).id
    running = first.jobs.add(new_job(name="r"), NOW).id
    start(first, running)
    done = first.jobs.add(new_job(name="d"), NOW).id
    end(first, done, exit_code=0)
    before = {j.id: j for j in first.jobs.active()}
    first.close()

    second = Store(url)
    try:
        after = {j.id: j for j in second.jobs.active()}
        assert after == before
        assert [j.id for j in second.jobs.active()] == [queued, held, running]
        assert second.jobs.get(queued).priority == 3
        assert second.jobs.get(running).pid == 4242
        assert [j.id for j in second.jobs.ended(10)] == [done]
        assert second.jobs.add(new_job(), NOW).id > done  # ids carry on
    finally:
        second.close()


def test_concurrent_adds_from_threads_and_a_second_store(database_url: str) -> None:
    """8 threads x 50 adds on each of two Store objects on one file: 800 rows, no lock error."""
    url = database_url
    one = Store(url)
    two = Store(url)
    errors: list[BaseException] = []
    ids: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def worker(s: Store, tag: str) -> None:
        try:
            barrier.wait()
            for i in range(50):
                job_id = s.jobs.add(new_job(name=f"{tag}-{i}"), NOW).id
                with lock:
                    ids.append(job_id)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(s, f"{label}{n}"))
        for s, label in ((one, "a"), (two, "b"))
        for n in range(8)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert len(set(ids)) == len(ids) == 800
        assert one.jobs.count() == 800
        names = {j.name for j in two.jobs.active()}
        assert names == {f"{p}{n}-{i}" for p in "ab" for n in range(8) for i in range(50)}
    finally:
        one.close()
        two.close()


def test_concurrent_compare_and_set_has_one_winner(database_url: str) -> None:
    url = database_url
    stores = [Store(url) for _ in range(4)]
    job_id = stores[0].jobs.add(new_job(), NOW).id
    results: list[bool] = []
    barrier = threading.Barrier(len(stores))

    def race(s: Store, n: int) -> None:
        barrier.wait()
        results.append(start(s, job_id, now=f"winner-{n}"))

    threads = [threading.Thread(target=race, args=(s, n)) for n, s in enumerate(stores)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(results) == [False, False, False, True]
        assert (stores[1].jobs.get(job_id).started_at or "").startswith("winner-")
    finally:
        for s in stores:
            s.close()


_SYNC_SCRIPT = """
import sys
from gpusched.core.models import JobState
from gpusched.store import NewJob, Store

store = Store(f"sqlite:///{sys.argv[1]}")
new = NewJob(user="a", uid=1, gid=1, command=["true"], cwd="/", env={}, umask=18, mem=None)
job_id = store.jobs.add(new, "t").id
print("MARK", flush=True)
store.jobs.mark_running(job_id, gpu_indices=[0], gpu_uuids=["u"], pid=None, pid_start_time=None,
                   log_path="l", now="t")
print("SETPID", flush=True)
store.jobs.set_pid(job_id, 42, "1.0")
print("ENDED", flush=True)
store.jobs.mark_ended(job_id, state=JobState.DONE, reason="exit", now="t", durable=False)
print("CANCEL", flush=True)
other = store.jobs.add(new, "t").id
print("CANCEL2", flush=True)
store.jobs.mark_ended(other, state=JobState.CANCELLED, reason="cancelled", now="t")
print("END", flush=True)
"""


def test_only_the_daemons_reconcilable_writes_skip_the_fsync(tmp_path: Path) -> None:
    """Submits, the start claim and user-requested ends are fsynced; set_pid and an
    ending read from the supervisor's exit record are not (see the Store docstring)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    script = tmp_path / "writes.py"
    script.write_text(_SYNC_SCRIPT)
    done = subprocess.run(
        [
            strace,
            "-f",
            "-e",
            "trace=fsync,fdatasync,write",
            "-e",
            "signal=none",
            sys.executable,
            str(script),
            str(tmp_path / "db"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    syncs: dict[str, int] = {}
    phase = "setup"
    for line in done.stderr.splitlines():
        printed = re.match(r'write\(1, "([A-Z0-9]+)(\\n)?"', line)
        if printed:
            phase = printed.group(1)
        elif "sync(" in line:
            syncs[phase] = syncs.get(phase, 0) + 1
    assert syncs.get("MARK", 0) >= 1, syncs  # mark_running: the start claim
    assert syncs.get("SETPID", 0) == 0, syncs
    assert syncs.get("ENDED", 0) == 0, syncs  # ended from the exit record
    assert syncs.get("CANCEL", 0) >= 1, syncs  # a submit
    assert syncs.get("CANCEL2", 0) >= 1, syncs  # a cancel the user was told about
