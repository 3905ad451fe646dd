"""Schema upgrades (gpusched.store.migrations, Alembic) on SQLite and PostgreSQL alike.

A database made by the code of earlier releases (create_all of their `jobs` table, no
alembic_version) is adopted with its queue; a new one is at the head revision and matches
the tables the code reads; a database of a newer gpusched is refused in one line, by the
Store and by a daemon starting on it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    JSON,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    text,
)

from gpusched.core.models import JobState
from gpusched.store import Store, metadata, timeline_points
from gpusched.store.migrations import HEAD, MIGRATIONS, SchemaTooNew
from tests.daemon_harness import RunningDaemon, directory_settings
from tests.postgres import PostgresServer
from tests.test_store import NOW, new_job, start


def head_revision() -> str:
    """The newest revision of the migrations shipped, as Alembic reads versions/."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None, f"no schema revision in {MIGRATIONS}"
    return head


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, db_path: Path) -> Iterator[str]:
    """An empty database (no table at all) on each backend."""
    if request.param == "sqlite":
        db_path.parent.mkdir(parents=True)
        yield f"sqlite:///{db_path}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.create_database()
    yield server.url(name)
    server.drop_database(name)


# The `jobs` table as the first release created it (gpusched/store.py at the first commit),
# and as it was just before the envs table and env_id: later columns were added by the
# "add the missing columns" code at each start, so a database may have any of these shapes.
def _first_release() -> list[Column[object]]:
    return [
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("name", String, nullable=True),
        Column("user", String, nullable=False),
        Column("uid", Integer, nullable=False),
        Column("gid", Integer, nullable=False),
        Column("state", String, nullable=False, index=True),
        Column("command", JSON, nullable=False),
        Column("cwd", Text, nullable=False),
        Column("env", JSON, nullable=False),
        Column("umask", Integer, nullable=False),
        Column("mem", Integer, nullable=True),
        Column("gpus", Integer, nullable=False),
        Column("gpu_indices", JSON, nullable=False, default=list),
        Column("gpu_uuids", JSON, nullable=False, default=list),
        Column("priority", Integer, nullable=False, default=0),
        Column("after", JSON, nullable=False, default=list),
        Column("submitted_at", String, nullable=False),
        Column("started_at", String, nullable=True),
        Column("ended_at", String, nullable=True, index=True),
        Column("pid", Integer, nullable=True),
        Column("pid_start_time", String, nullable=True),
        Column("exit_code", Integer, nullable=True),
        Column("reason", String, nullable=True),
        Column("reason_detail", Text, nullable=True),
        Column("log_path", Text, nullable=True),
        Column("peak_mem", Integer, nullable=True),
        Column("mean_util", Integer, nullable=True),
        Column("hints", JSON, nullable=False, default=list),
    ]


def _before_envs() -> list[Column[object]]:
    return [
        *_first_release(),
        Column("stop_intent", String, nullable=True),
        Column("util_min", Integer, nullable=True),
        Column("util_max", Integer, nullable=True),
        Column("util_stddev", Float, nullable=True),
        Column("overrun_at", String, nullable=True),
        Column("retry_oom", Integer, nullable=True),
        Column("retry_of", Integer, nullable=True),
        Column("retried_as", Integer, nullable=True),
        Column("usage_state", JSON, nullable=True),
        Column("array_id", Integer, nullable=True),
        Column("array_index", Integer, nullable=True),
        Column("max_concurrent", Integer, nullable=True),
        Column("time_limit_s", Float, nullable=True),
        Column("notify", JSON, nullable=True),
        Column("hooks_due", Integer, nullable=True),
    ]


def _old_database(
    url: str, columns: Callable[[], list[Column[object]]], **job: Any
) -> tuple[int, int]:
    """A database as an earlier release's code left it, with a queued and an ended job
    (`job`: columns of both, over alice's `python train.py`)."""
    old = MetaData()
    table = Table("jobs", old, *columns())
    engine = create_engine(url)
    try:
        old.create_all(engine)  # what the old Store did at each start
        row = {
            "user": "alice",
            "uid": 1000,
            "gid": 1000,
            "command": ["python", "train.py"],
            "cwd": "/home/alice",
            "env": {"PATH": "/usr/bin"},
            "umask": 0o022,
            "mem": 2**30,
            "gpus": 1,
            "gpu_indices": [],
            "gpu_uuids": [],
            "priority": 0,
            "after": [],
            "submitted_at": NOW,
            "hints": [],
            **job,
        }
        with engine.begin() as conn:
            queued = conn.execute(table.insert().values(**row, state="queued", name="q"))
            ended = conn.execute(
                table.insert().values(
                    **row, state="done", name="d", ended_at=NOW, exit_code=0, reason="exit"
                )
            )
            assert queued.inserted_primary_key is not None
            assert ended.inserted_primary_key is not None
            return int(queued.inserted_primary_key[0]), int(ended.inserted_primary_key[0])
    finally:
        engine.dispose()


def _revisions(store: Store) -> list[str]:
    with store.database.engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_head_is_the_newest_revision_shipped() -> None:
    assert head_revision() == HEAD  # a new revision in versions/ moves migrations.HEAD too


def test_a_new_database_is_at_the_head_and_matches_the_code(empty_url: str) -> None:
    store = Store(empty_url)
    try:
        assert _revisions(store) == [head_revision()]
        with store.database.engine.connect() as conn:
            drift = compare_metadata(MigrationContext.configure(conn), metadata)
        assert drift == [], "the tables the migrations make differ from gpusched.store.schema's"
    finally:
        store.close()


@pytest.mark.parametrize("columns", [_first_release, _before_envs], ids=["first", "before-envs"])
def test_a_database_of_an_earlier_release_keeps_its_queue(
    empty_url: str, columns: Callable[[], list[Column[object]]]
) -> None:
    queued, ended = _old_database(empty_url, columns)
    store = Store(empty_url)
    try:
        assert _revisions(store) == [head_revision()]
        assert [j.id for j in store.jobs.active()] == [queued]
        assert store.jobs.get(queued).name == "q"
        assert store.jobs.get(queued).state is JobState.QUEUED
        assert store.jobs.launch_info(queued).env == {"PATH": "/usr/bin"}  # inline, as then
        assert [j.id for j in store.jobs.ended(10)] == [ended]
        assert store.jobs.get(ended).retry_oom is None  # a column the old rows lacked: NULL
        # The old queue goes on: its job starts, and new jobs follow it.
        assert start(store, queued)
        added = store.jobs.add(new_job(mem=80 * 2**30), NOW)
        assert added.id > ended
        assert store.jobs.get(added.id).mem == 80 * 2**30
    finally:
        store.close()
    again = Store(empty_url)  # a second start has nothing to do
    try:
        assert _revisions(again) == [head_revision()]
        assert again.jobs.count() == 3
    finally:
        again.close()


def test_a_database_made_by_create_all_of_the_last_release_is_adopted(empty_url: str) -> None:
    """The release just before schema revisions made every table, timeline_points too, with
    create_all: the revisions find them all, keep their rows and record the revision."""
    engine = create_engine(empty_url)
    try:
        metadata.create_all(engine)  # what that release's Store did at each start
    finally:
        engine.dispose()
    queued, _ = _old_database(empty_url, _before_envs)  # rows into the tables made above
    engine = create_engine(empty_url)
    try:
        with engine.begin() as conn:
            conn.execute(timeline_points.insert().values(job_id=queued, t=1.0, memory=5, samples=1))
    finally:
        engine.dispose()
    store = Store(empty_url)
    try:
        assert _revisions(store) == [head_revision()]
        assert [j.id for j in store.jobs.active()] == [queued]
        assert [(p.t, p.memory_bytes) for p in store.timeline.timeline_rows(queued)] == [(1.0, 5)]
    finally:
        store.close()


def _from_the_future(url: str) -> None:
    Store(url).close()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'f9999_future'"))
    finally:
        engine.dispose()


def test_a_newer_schema_is_refused(empty_url: str) -> None:
    _from_the_future(empty_url)
    with pytest.raises(SchemaTooNew) as refused:
        Store(empty_url)
    message = refused.value.message
    assert "f9999_future" in message
    assert "newer than this gpusched knows" in message
    assert "\n" not in message


def test_a_daemon_facing_a_newer_schema_refuses_to_start(empty_url: str, tmp_path: Path) -> None:
    _from_the_future(empty_url)
    root = tmp_path / "daemon"
    root.mkdir()
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({**directory_settings(root), "database": empty_url}))
    config.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "gpusched", "--config", str(config), "daemon"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "schema revision f9999_future, newer than this gpusched knows" in last, done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / "gpusched.sock").exists()


def test_a_daemon_upgraded_over_an_old_database_runs_its_queue(daemon_factory: Any) -> None:
    """The upgrade as an administrator makes it: the new daemon starts on the file the
    previous release left, and the job that was waiting in it runs."""
    daemon: RunningDaemon = daemon_factory()
    url = f"sqlite:///{daemon.root / 'gpusched.db'}"
    queued, ended = _old_database(
        url, _first_release, user="root", uid=0, gid=0, command=["sh", "-c", "exit 4"], cwd="/"
    )
    daemon.start()
    assert daemon.cli("wait", str(queued), timeout=60).returncode == 4
    assert daemon.show(queued)["state"] == "failed"
    assert daemon.show(ended)["state"] == "done"
    assert f"schema (none: new, or made before schema revisions) -> {head_revision()}" in (
        daemon.stderr()
    )
