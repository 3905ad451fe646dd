"""A waiting job's expected demand, from its owner's past runs (gpusched.usage.monitor's
`expected_demand`, over the store's `demand_records`): the same sweep first, else the
same --name, else the same command. A real SQLite store; demands are written as a job's
end writes them (store.usage.set_usage)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.store import NewJob, Store
from gpusched.store.schema import jobs
from gpusched.usage.monitor import UsageMonitor

NOW = "2026-01-05T09:00:00+00:00"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store(f"sqlite:///{tmp_path / 'gpusched.db'}")
    yield made
    made.close()


def _new(uid: int = 1000, command: tuple[str, ...] = ("python", "train.py"), **spec: str) -> NewJob:
    user = "alice" if uid == 1000 else "bob"
    return NewJob(
        user=user, uid=uid, gid=1000, command=list(command), cwd="/", env={}, umask=0o022,
        mem=2**30, **spec,  # type: ignore[arg-type]
    )  # fmt: skip


def _ran(
    store: Store,
    demand: float,
    uid: int = 1000,
    command: tuple[str, ...] = ("python", "train.py"),
    name: str | None = None,
) -> None:
    """A past run whose end recorded `demand` (the measured figures a job's end writes)."""
    new = _new(uid, command) if name is None else _new(uid, command, name=name)
    store.usage.set_usage(store.jobs.add(new, NOW).id, demand=demand)


def test_a_job_that_never_ran_expects_what_its_past_runs_used(store: Store) -> None:
    monitor = UsageMonitor(store.usage, store.timeline)
    for demand in (0.9, 0.95, 0.1):
        _ran(store, demand, name="train")
    _ran(store, 0.05, name="eval", command=("python", "eval.py"))
    _ran(store, 0.5, uid=1001, name="train")  # another user's: not this one's history
    named = store.jobs.add(_new(name="train", command=("python", "other.py")), NOW)
    assert monitor.expected_demand(named) == 0.9  # the median of 0.9, 0.95, 0.1
    same_command = store.jobs.add(_new(), NOW)
    assert monitor.expected_demand(same_command) == 0.9  # train.py's runs
    stranger = store.jobs.add(_new(command=("./new",)), NOW)
    assert monitor.expected_demand(stranger) is None  # nothing like it ran: unknown


def test_a_sweeps_jobs_expect_what_the_sweeps_finished_jobs_used(store: Store) -> None:
    monitor = UsageMonitor(store.usage, store.timeline)
    _ran(store, 0.2, name="sweep")
    first, second = (store.jobs.add(_new(name="sweep"), NOW) for _ in range(2))
    with (
        store.database.engine.begin() as conn
    ):  # two jobs of one array, as submit --sweep makes them
        conn.execute(jobs.update().where(jobs.c.id.in_([first.id, second.id])).values(array_id=7))
    store.usage.set_usage(first.id, demand=0.8)
    second = store.jobs.get(second.id)
    assert monitor.expected_demand(second) == 0.8  # its sweep's, before its --name's
