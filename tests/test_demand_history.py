"""A waiting job's expected demand, from its owner's past runs (gpusched.usage.monitor's
`expected_demand`, over the store's `demand_records`): the same sweep first, else the
same --name, else the same command; a job with none of these, its owner's latest ended
runs when they agree (the owner prior). A real SQLite store; demands are written as a
job's end writes them (store.usage.set_usage, store.jobs.mark_ended's usage)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.models import JobState
from gpusched.scheduling.policy.budget import BUSY_DEMAND as POLICY_BUSY_DEMAND
from gpusched.store import NewJob, Store
from gpusched.store.schema import jobs
from gpusched.usage.demand_history import BUSY_DEMAND, OWNER_RUNS, DemandHistory, OwnerPrior
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


def _ended(store: Store, demand: float, minute: int, uid: int = 1000, name: str = "old") -> int:
    """An ended run of the owner's (another project: `name`) whose end recorded `demand`,
    ended at 10:`minute` (the latest ended runs are the owner prior's)."""
    job = store.jobs.add(_new(uid, ("python", f"{name}.py"), name=name), NOW)
    ended = f"2026-01-05T10:{minute:02d}:00+00:00"
    assert store.jobs.mark_ended(
        job.id, state=JobState.DONE, reason="exited", now=ended, usage={"demand": demand}
    )
    return job.id


def test_a_new_project_expects_its_owners_latest_runs_when_all_were_busy(store: Store) -> None:
    """A job with no history of its own (no same sweep, --name or command) is expected to
    demand what its owner's latest OWNER_RUNS ended runs did when they were all busy
    (their median); mixed, all light or fewer: unknown, as before (in a loaded queue an
    owner's latest ended runs read light while their waiting jobs are busy)."""
    monitor = UsageMonitor(store.usage, store.timeline)
    new = store.jobs.add(_new(command=("python", "new.py"), name="new"), NOW)
    for minute in range(OWNER_RUNS - 1):
        _ended(store, 0.9 + minute / 100, minute)
    assert monitor.expected_demand(new) is None  # too few: nothing known
    _ended(store, 0.8, 10)
    monitor = UsageMonitor(store.usage, store.timeline)  # a fresh read of the history
    assert monitor.expected_demand(new) == 0.91  # the median of 0.9, 0.91, 0.92, 0.93, 0.8
    assert monitor.expected(new) == (0.91, OWNER_RUNS)  # said as its owner's runs
    prior = DemandHistory(store.usage.demand_records()).owner_prior(new.id, new.uid)
    assert prior == OwnerPrior(0.91, OWNER_RUNS) and prior.busy
    _ended(store, 0.1, 20)  # the latest five: four busy, one light: mixed
    monitor = UsageMonitor(store.usage, store.timeline)
    assert monitor.expected_demand(new) is None
    for minute in range(30, 30 + OWNER_RUNS - 1):  # now the latest five are all light
        _ended(store, 0.2, minute)
    monitor = UsageMonitor(store.usage, store.timeline)
    assert monitor.expected_demand(new) is None
    for minute in range(40, 40 + OWNER_RUNS):  # and now all busy again
        _ended(store, 0.85, minute)
    monitor = UsageMonitor(store.usage, store.timeline)
    assert monitor.expected_demand(new) == 0.85


def test_a_jobs_own_history_wins_over_its_owners_and_other_users_never_count(
    store: Store,
) -> None:
    """Its own runs (the same --name) decide even against five agreeing runs of its
    owner's; another user's runs never make an owner prior; a running job's figure (not
    an ended run) is no part of it."""
    for minute in range(OWNER_RUNS):
        _ended(store, 0.95, minute)
    _ended(store, 0.1, 10, name="light")
    light = store.jobs.add(_new(command=("python", "x.py"), name="light"), NOW)
    monitor = UsageMonitor(store.usage, store.timeline)
    assert monitor.expected_demand(light) == 0.1  # its own, not its owner's busy runs
    bobs = store.jobs.add(_new(1001, ("python", "new.py"), name="new"), NOW)
    assert monitor.expected_demand(bobs) is None  # alice's runs say nothing of bob's
    for minute in range(20, 20 + OWNER_RUNS - 1):
        _ended(store, 0.9, minute, uid=1001)
    running = store.jobs.add(_new(1001, ("python", "run.py"), name="run"), NOW)
    store.usage.set_usage(running.id, demand=0.9)  # flushed while it runs: not ended
    monitor = UsageMonitor(store.usage, store.timeline)
    assert monitor.expected_demand(bobs) is None  # four ended runs of bob's: too few


def test_the_owner_priors_busy_line_is_the_policys() -> None:
    """usage may not import the policy: the two figures for "busy" are kept equal here."""
    assert BUSY_DEMAND == POLICY_BUSY_DEMAND


def test_runs_that_end_meanwhile_count_at_once_for_the_owner_prior_too() -> None:
    """The history a pass reads is kept for a minute; runs that ended on this server in
    that minute (UsageMonitor.finish -> DemandHistory.add) count at once, for the owner's
    prior as for the job's own kind."""
    history = DemandHistory([])
    assert history.owner_prior(100, 1000) is None
    for job_id in range(1, OWNER_RUNS + 1):
        history.add(
            job_id=job_id, uid=1000, array_id=None, name=f"p{job_id}",
            command=["python", f"p{job_id}.py"], demand=0.95,
        )  # fmt: skip
    prior = history.owner_prior(100, 1000)
    assert prior == OwnerPrior(demand=0.95, runs=OWNER_RUNS)
    assert history.owner_prior(100, 1001) is None  # another user's runs say nothing
    assert history.expected(100, 1000, None, "p3", ["python", "x.py"]) == 0.95
    # One light run among the latest five: mixed, unknown again.
    history.add(job_id=99, uid=1000, array_id=None, name="light", command=["l.py"], demand=0.05)
    assert history.owner_prior(100, 1000) is None
