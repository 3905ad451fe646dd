"""Retention (gpusched.store.retention, the `retention:` key): a real store (SQLite and
PostgreSQL: conftest's `store`), jobs ended at chosen times, one prune as of a chosen moment."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpusched.config.retention import DAY_S, RetentionSettings, parse_retention
from gpusched.config.settings import load_config
from gpusched.core.clock import iso
from gpusched.core.errors import ConfigError
from gpusched.core.models import JobState
from gpusched.store import NewJob, Store, TimelineRow, TimelineWrite
from gpusched.store.retention import prune

NOW = 1_800_000_000.0


def _at(seconds_ago: float) -> str:
    return iso(datetime.fromtimestamp(NOW - seconds_ago, timezone.utc))


def _job(
    store: Store,
    env: dict[str, str],
    ended_ago: float | None,
    log: str | None,
    hooks_due: bool = False,
) -> int:
    job = store.jobs.add(
        NewJob(
            user="alice",
            uid=1000,
            gid=1000,
            command=["true"],
            cwd="/",
            env=env,
            umask=0o022,
            mem=2**30,
            gpus=1,
            held=True,
        ),
        _at((ended_ago or 0) + 60),
    )
    if ended_ago is not None:
        assert store.jobs.mark_ended(
            job.id,
            state=JobState.DONE,
            reason="exit",
            now=_at(ended_ago),
            log_path=log,
            timeline=TimelineWrite((TimelineRow(NOW - ended_ago, 1, 1.0),)),
            hooks_due=hooks_due,
        )
    return job.id


def test_each_kind_goes_at_its_own_age_and_active_jobs_are_never_touched(store: Store) -> None:
    settings = RetentionSettings(
        history_s=100 * DAY_S, environments_s=1 * DAY_S, timelines_s=10 * DAY_S, logs_s=5 * DAY_S
    )
    ancient = _job(store, {"A": "1"}, 200 * DAY_S, "/logs/1.log")
    old = _job(store, {"B": "2"}, 20 * DAY_S, "/logs/2.log")
    week = _job(store, {"C": "3"}, 7 * DAY_S, "/logs/3.log")
    recent = _job(store, {"D": "4"}, 60.0, "/logs/4.log")
    waiting = _job(store, {"A": "1"}, None, None)  # shares the ancient job's environment
    done = prune(store.database, settings, NOW)
    assert done.jobs == 1 and sorted(done.logs) == ["/logs/1.log", "/logs/2.log", "/logs/3.log"]
    assert set(store.jobs.get_many([ancient, old, week, recent, waiting])) == {
        old,
        week,
        recent,
        waiting,
    }
    assert store.timeline.job_timeline(old) == [] and store.timeline.job_timeline(week) != []
    assert store.jobs.launch_info(old).env_dropped and store.jobs.launch_info(old).env == {}
    assert store.jobs.launch_info(recent).env == {"D": "4"}
    assert store.jobs.launch_info(waiting).env == {"A": "1"}  # still used: kept
    assert done.environments == 2 and done.stored_environments == 2  # B and C
    again = prune(store.database, settings, NOW)
    assert not again  # idempotent: nothing left to do


def test_null_keeps_forever(store: Store) -> None:
    _job(store, {"A": "1"}, 10_000 * DAY_S, "/logs/1.log")
    none = RetentionSettings(history_s=None, environments_s=None, timelines_s=None, logs_s=None)
    assert not prune(store.database, none, NOW)


def test_the_key_parses_with_units_and_refuses_nonsense(tmp_path: Path) -> None:
    assert parse_retention({"history": "30d", "user_bytes_per_day": "1G"}) == RetentionSettings(
        history_s=30 * DAY_S, user_bytes_per_day=2**30
    )
    assert parse_retention({"logs": None}).logs_s is None
    path = tmp_path / "c.yaml"
    for bad in ("retention: {history: soon}", "retention: {forever: 1d}", "retention: 3"):
        path.write_text(bad)
        with pytest.raises(ConfigError, match="retention"):
            load_config(path)


def _waiting_for(store: Store, job_id: int) -> int:
    job = store.jobs.add(
        NewJob(
            user="bob",
            uid=1001,
            gid=1001,
            command=["true"],
            cwd="/",
            env={},
            umask=0o022,
            mem=2**30,
            gpus=1,
            held=True,
            after=(job_id,),
        ),
        _at(0),
    )
    return job.id


def test_history_keeps_what_an_active_job_waits_for_and_a_dry_run_changes_nothing(
    store: Store,
) -> None:
    """The rules `gpusched admin prune` shares with the retention pass (one implementation):
    a job an active job waits for (`--after`) stays to be judged, and a job whose hooks are
    due stays for them; a dry run counts exactly what the real one then deletes."""
    history = RetentionSettings(history_s=DAY_S, environments_s=None, timelines_s=None, logs_s=None)
    waited_for = _job(store, {"A": "1"}, 10 * DAY_S, "/logs/1.log")
    gone = _job(store, {"B": "2"}, 10 * DAY_S, "/logs/2.log")
    hooked = _job(store, {"C": "3"}, 10 * DAY_S, "/logs/3.log", hooks_due=True)
    dependent = _waiting_for(store, waited_for)
    dry = prune(store.database, history, NOW, dry_run=True)
    assert (dry.jobs, dry.logs) == (1, ["/logs/2.log"])
    assert set(store.jobs.get_many([waited_for, gone, hooked, dependent])) == {
        waited_for,
        gone,
        hooked,
        dependent,
    }
    done = prune(store.database, history, NOW)
    assert (done.jobs, sorted(done.logs)) == (dry.jobs, dry.logs)
    assert set(store.jobs.get_many([waited_for, gone, hooked, dependent])) == {
        waited_for,
        hooked,
        dependent,
    }
