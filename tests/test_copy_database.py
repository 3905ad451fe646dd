"""`gpusched admin copy-database`: a one-server SQLite queue and history into another
database (PostgreSQL, or another SQLite file), through the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.core.models import ACTIVE_STATES, EndReason, Job, JobState
from gpusched.store import LaunchInfo, Store, StoredClaim, TimelineRow, TimelineWrite
from gpusched.store.attempts import record_requeued
from tests.test_store import NOW, end, new_job, start


def _copy(source: str, target: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["admin", "copy-database", "--from", source, "--to", target, *extra]
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_server(path: Path) -> tuple[str, dict[str, int]]:
    """An installation's queue: every state, an array, a dependency and an OOM retry."""
    url = f"sqlite:///{path}"
    store = Store(url)
    try:
        ids = {
            "done": store.jobs.add(new_job(name="done"), NOW).id,
            "running": store.jobs.add(new_job(name="running", env={"A": "1"}), NOW).id,
            "held": store.jobs.add(new_job(name="held", held=True), NOW).id,
        }
        ids["after"] = store.jobs.add(new_job(name="after", after=(ids["running"],)), NOW).id
        array = store.jobs.add_many([new_job(name=f"sweep-{i}") for i in range(3)], NOW)
        ids["array"] = array[0].id
        assert start(store, ids["done"])
        assert end(store, ids["done"], exit_code=0)
        assert start(store, ids["running"])
        points = tuple(TimelineRow(1000.0 + i, i * 2**30, 50.0, 1) for i in range(3))
        store.usage.set_usage(ids["running"], timeline=TimelineWrite(points), peak_mem=2 * 2**30)
        oom = store.jobs.add(new_job(name="oom", retry_oom=1), NOW).id
        assert start(store, oom)
        assert end(store, oom, state=JobState.FAILED, reason=str(EndReason.OOM))
        ids["oom"] = oom
        ids["retry"] = store.usage.add_retry(oom, 16 * 2**30).id
        with (
            store.database.engine.begin() as conn
        ):  # two earlier runs of a requeued job (a cluster's)
            for node in ("a", "b"):
                record_requeued(
                    conn,
                    ids["done"],
                    node=node,
                    started_at=NOW,
                    cards=(["GPU-1"], [0]),
                    now=NOW,
                    why=f"{node} down",
                )
        store.head_claims.keep(StoredClaim(ids["after"], ("GPU-1", "GPU-2"), 2**30))
    finally:
        store.close()
    return url, ids


def _everything(url: str) -> dict[int, tuple[Job, LaunchInfo, list[TimelineRow]]]:
    store = Store(url)
    try:
        found = store.jobs.get_many(range(1, store.jobs.count() + 100))
        return {
            i: (job, store.jobs.launch_info(i), store.timeline.timeline_rows(i))
            for i, job in found.items()
        }
    finally:
        store.close()


def _history(url: str) -> tuple[dict[int, list[dict[str, object]]], StoredClaim | None]:
    """The earlier runs of every job, and the head's kept cards."""
    store = Store(url)
    try:
        return store.attempts.earlier_runs(
            range(1, store.jobs.count() + 100)
        ), store.head_claims.current()
    finally:
        store.close()


def test_ids_states_environments_and_history_are_copied(tmp_path: Path, database_url: str) -> None:
    source, ids = _one_server(tmp_path / "one-server.db")
    before = _everything(source)
    history = _history(source)
    assert len(history[0][ids["done"]]) == 2 and history[1] is not None

    done = _copy(source, database_url)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(
        f"copied {len(before)} jobs (7 not ended), 2 environments, 3 time-series points"
        " and 2 earlier runs"
    )
    assert "ids kept" in done.stdout
    assert _everything(database_url) == before
    assert _history(database_url) == history
    target = Store(database_url)
    try:
        active = [i for i, (job, *_) in sorted(before.items()) if job.state in ACTIVE_STATES]
        assert [j.id for j in target.jobs.active()] == active
        assert target.jobs.get(ids["retry"]).retry_of == ids["oom"]
        assert target.jobs.add(new_job(), NOW).id > max(before)  # the target's ids carry on
        assert target.jobs.add_many([new_job()], NOW)[0].array_id == 2  # so do array ids
    finally:
        target.close()


def test_a_target_with_jobs_is_refused_unless_merging(tmp_path: Path, database_url: str) -> None:
    source, ids = _one_server(tmp_path / "one-server.db")
    theirs = Store(database_url)
    try:
        theirs.jobs.add_many([new_job(user="bob") for _ in range(10)], NOW)  # array 1
    finally:
        theirs.close()

    refused = _copy(source, database_url)

    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]  # one line
    assert "already has jobs (up to id 10)" in refused.stderr
    assert len(_everything(database_url)) == 10  # nothing written

    # --merge: refused while a source job runs (its supervisor knows it by id)...
    running = _copy(source, database_url, "--merge")
    assert running.returncode != 0
    assert "1 jobs of" in running.stderr and "are running" in running.stderr
    store = Store(source)
    try:
        assert end(store, ids["running"], exit_code=0)
    finally:
        store.close()

    # ... then shifted past the target's ids, with what names a job by id.
    merged = _copy(source, database_url, "--merge")

    assert merged.returncode == 0, merged.stderr
    assert "ids shifted by +10" in merged.stdout
    target = Store(database_url)
    try:
        assert target.jobs.get(ids["after"] + 10).after == [ids["running"] + 10]
        assert target.jobs.get(ids["retry"] + 10).retry_of == ids["oom"] + 10
        assert target.jobs.get(ids["oom"] + 10).retried_as == ids["retry"] + 10
        assert target.jobs.get(ids["array"] + 10).array_id == 2  # after bob's
        assert target.jobs.launch_info(ids["running"] + 10).env == {"A": "1"}
        assert [p.t for p in target.timeline.timeline_rows(ids["running"] + 10)] == [
            1000,
            1001,
            1002,
        ]
        runs = target.attempts.earlier_runs([ids["done"] + 10])[ids["done"] + 10]
        assert [(r["attempt"], r["node"]) for r in runs] == [(1, "a"), (2, "b")]
        head = target.head_claims.current()
        assert head is not None and head.job_id == ids["after"] + 10
        assert target.jobs.get(5).user == "bob"
    finally:
        target.close()


def test_a_missing_source_is_refused(tmp_path: Path, database_url: str) -> None:
    missing = tmp_path / "nothing-here.db"
    done = _copy(f"sqlite:///{missing}", database_url)
    assert done.returncode != 0
    assert f"no database at sqlite:///{missing}" in done.stderr
    assert not missing.exists()


@pytest.mark.parametrize("merge", [False, True])
def test_the_same_database_is_refused(tmp_path: Path, merge: bool) -> None:
    source, _ = _one_server(tmp_path / "one-server.db")
    done = _copy(source, source, *(["--merge"] if merge else []))
    assert done.returncode != 0
    assert "the same database" in done.stderr
