"""Light jobs packed onto one card until it saturates (gpusched.usage.monitor over a real
SQLite store): the card's utilization is min(100, the sum of its jobs' true demands) and
a light job's own per-process figure, in the few polls that sample it, is its demand
slowed by the sharing. A card whose busy time is all taken must read full: a job's
demand read there may be raised, never lowered below what is known of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.core.models import GpuProcess, GpuState, Job
from gpusched.store import NewJob, Store
from gpusched.usage.demand import CardPoll, DemandTracker
from gpusched.usage.monitor import UsageMonitor

NOW = "2026-01-05T09:00:00+00:00"
GiB = 2**30
UUID = "GPU-shared-0"
TRUE_DEMAND = 0.10
# A light job's per-process figure is sampled in about 4 of 17 polls (FIELD.md).
SAMPLED_OF = (4, 17)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store(f"sqlite:///{tmp_path / 'gpusched.db'}")
    yield made
    made.close()


def _job(store: Store) -> Job:
    new = NewJob(
        user="alice", uid=1000, gid=1000, command=["python", "load.py"], cwd="/", env={},
        umask=0o022, mem=GiB, name="loader",
    )  # fmt: skip
    return store.jobs.add(new, NOW)


def _poll(monitor: UsageMonitor, jobs: list[Job], step: int) -> None:
    """One poll of the card with `jobs` on it, each of true demand TRUE_DEMAND."""
    total = TRUE_DEMAND * len(jobs)
    speed = min(1.0, 1.0 / total) if total else 1.0
    pids = {job.id: 50_000 + job.id for job in jobs}
    sampled = {
        pids[job.id]: round(TRUE_DEMAND * speed * 100)
        for n, job in enumerate(jobs)
        if (step + n) % SAMPLED_OF[1] < SAMPLED_OF[0]
    }
    procs = tuple(GpuProcess(pid, GiB) for pid in pids.values())
    gpu = GpuState(
        0, UUID, "H200", 141 * GiB, len(jobs) * GiB, (141 - len(jobs)) * GiB,
        util_percent=round(min(100.0, total * 100)), processes=procs,
    )  # fmt: skip
    monitor.observe(
        now_s=float(step),
        now_iso=NOW,
        gpus=[gpu],
        running=jobs,
        processes={job.id: {UUID: (GpuProcess(pids[job.id], GiB),)} for job in jobs},
        process_util={UUID: sampled},
        margin_fraction=0.0,
        margin_bytes=GiB,
    )


@pytest.mark.parametrize("told_at_start", [True, False], ids=["started", "restored"])
def test_light_jobs_stop_being_packed_once_their_card_is_saturated(
    store: Store, told_at_start: bool
) -> None:
    """The policy adds a light job to a card while its jobs' demands plus the newcomer's
    stay within 100 %: packing stops at about ten jobs of 0.10, not twenty. Whether the
    daemon started the job (`started`, as the starter tells the monitor) or finds it
    running after a restart (its tracker read from the store at its first poll)."""
    store.usage.set_usage(_job(store).id, demand=TRUE_DEMAND)  # an earlier run, measured
    monitor = UsageMonitor(store.usage, store.timeline)
    jobs: list[Job] = []
    for step in range(300):
        estimates = [monitor.expected_demand(job) for job in jobs]
        if sum(e if e is not None else 0.0 for e in estimates) + TRUE_DEMAND <= 1.0 + 1e-9:
            jobs.append(_job(store))
            if told_at_start:
                monitor.started(jobs[-1])
        _poll(monitor, jobs, step)
    assert TRUE_DEMAND * len(jobs) <= 1.0 + TRUE_DEMAND + 1e-9, len(jobs)
    last = jobs[-1]
    monitor.finish(last)  # what its end records is no lower than what was known of it
    assert (monitor.expected(_job(store))[0] or 0.0) >= TRUE_DEMAND


def _saturated(own: float | None, jobs_on_card: int) -> CardPoll:
    neighbours: dict[int, float | None] = dict.fromkeys(range(1, jobs_on_card))
    return CardPoll(0, 100.0, own, True, neighbours)


def test_a_saturated_card_never_lowers_what_is_known_of_a_job() -> None:
    """Known from history at 0.10, then only seen taking turns on a card of twenty jobs
    with a sample in few polls: still 0.10, not the sliver of the card it obtained."""
    tracker = DemandTracker(prior=TRUE_DEMAND)
    for step in range(17):
        tracker.observe(_saturated(5.0 if step < 4 else None, 20))
    assert tracker.demand() == TRUE_DEMAND


def test_a_job_taking_turns_counts_at_least_its_slice_of_the_card() -> None:
    """Nothing known of it, its samples few: the card's busy time is all taken, so each
    of its jobs counts for at least its turn's worth and the card reads full."""
    tracker = DemandTracker()
    for step in range(17):
        tracker.observe(_saturated(5.0 if step < 4 else None, 20))
    assert tracker.demand() == pytest.approx(0.05)


def test_a_job_the_daemon_starts_has_its_kinds_demand_as_its_floor(store: Store) -> None:
    """The starter tells the monitor of each job it starts: that tracker, like one read
    back after a restart, starts with what its kind's runs demanded as its floor."""
    store.usage.set_usage(_job(store).id, demand=TRUE_DEMAND)  # an earlier run, measured
    monitor = UsageMonitor(store.usage, store.timeline)
    job = _job(store)
    monitor.started(job)
    assert monitor.tracker(job).sharing.prior == TRUE_DEMAND
