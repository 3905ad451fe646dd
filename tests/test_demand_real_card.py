"""What a real NVIDIA H100 showed the usage monitor (session 8, `benchmarks/real_card.py`,
driver 580, PyTorch 2.11, one card, the daemon's default 2 s poll), replayed through the
real UsageMonitor on a real SQLite store: the device's and each process's utilization, poll
by poll, as NVML gave them.

On that card the daemon measured a busy matmul loop alone at 0.72 of its card (device 97 %),
recorded two busy loops sharing the card at their halves (0.46 each) and told one of them to
fix its data loader, put a light loop at 0.44 after its busy neighbours ended, and started a
second run of a busy script beside the first although the first run had just ended busy.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpusched.core.hints import JobFacts, job_hints
from gpusched.core.models import GpuProcess, GpuState, Job, JobState
from gpusched.store import NewJob, Store
from gpusched.usage.monitor import UsageMonitor

GiB = 2**30
NOW = "2026-11-26T16:18:52.000+00:00"
LATER = "2026-11-26T16:19:17.000+00:00"
UUID = "GPU-8051d731"

# A bf16 matmul loop alone (job 1): the device's figure at each poll, from its start.
BUSY_ALONE = [19, 96, 98, 98, 98, 98, 98, 98, 98, 98, 98]
# Two such loops started together (jobs 3 and 4): the device read 100 % from the second poll
# on; each process's own figure swung with its time slices.
PAIR_DEVICE = [12, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100]
PAIR_OWN = (
    [12, 50, 70, 40, 80, 20, 50, 50, 40, 50, 20, 50],
    [10, 50, 30, 60, 20, 80, 50, 50, 60, 50, 80, 50],
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


@pytest.fixture
def card(store: Store) -> Iterator[Card]:
    polled = Card(store)
    yield polled
    for process in polled.processes:
        process.kill()
        process.wait()


class Card:
    """One GPU and the jobs holding memory on it, polled as the daemon polls it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.monitor = UsageMonitor(store.usage, store.timeline, monotonic=lambda: 0.0)
        self.at_s = 0.0
        self.pids: dict[int, int] = {}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> Job:
        job = self.store.jobs.add(
            NewJob(
                user="alice", uid=1000, gid=1000, command=["python", f"{name}.py"], cwd="/",
                env={}, umask=0o022, mem=4 * GiB, name=name,
            ),
            NOW,
        )  # fmt: skip
        # A live process per job: the monitor leaves out the figures of exited ones.
        self.processes.append(subprocess.Popen(["sleep", "600"]))
        pid = self.processes[-1].pid
        assert self.store.jobs.mark_running(
            job.id, gpu_indices=[0], gpu_uuids=[UUID], pid=pid, pid_start_time="1",
            log_path="/nonexistent.log", now=NOW,
        )  # fmt: skip
        self.monitor.started(job)
        self.pids[job.id] = pid
        return self.store.jobs.get(job.id)

    def poll(self, device: float, own: dict[int, float | None]) -> None:
        """One poll: the card's figure and each running job's own (None: no sample)."""
        running = [self.store.jobs.get(job_id) for job_id in own]
        procs = tuple(GpuProcess(self.pids[j.id], GiB) for j in running)
        gpu = GpuState(0, UUID, "NVIDIA H100 80GB HBM3", 80 * GiB, len(procs) * GiB,
                       (80 - len(procs)) * GiB, int(device), processes=procs)  # fmt: skip
        self.monitor.observe_gpus([gpu])
        self.at_s += 2.0
        self.monitor.observe(
            now_s=self.at_s,
            now_iso=NOW,
            gpus=[gpu],
            running=running,
            processes={j.id: {UUID: [GpuProcess(self.pids[j.id], GiB)]} for j in running},
            process_util={UUID: {self.pids[j]: int(v) for j, v in own.items() if v is not None}},
            margin_fraction=0.10,
            margin_bytes=0,
        )

    def quiet(self, polls: int) -> None:
        """The card before: a light job's polls, then nothing of ours."""
        for _ in range(polls):
            self.poll(1.0, {})

    def end(self, job: Job) -> JobFacts:
        tracker = self.monitor.finish(job)
        summary = tracker.summary()
        self.store.usage.set_usage(job.id, demand=summary["demand"])
        assert self.store.jobs.mark_ended(job.id, state=JobState.DONE, reason="exit", now=LATER)
        return JobFacts(
            mem=4 * GiB, state="done", reason="exit", runtime_s=300.0, peak_mem=4 * GiB,
            util_samples=tracker.util_samples, util_mean=tracker.util_mean,
            util_min=tracker.util_min, util_max=tracker.util_max,
            util_stddev=tracker.util_stddev,
            contended_fraction=tracker.sharing.contended_fraction(),
            shared_with=tuple(tracker.sharing.shared_with),
            shared_gpus=tuple(tracker.sharing.shared_gpus),
            sharing_speed=tracker.sharing.sharing_speed(),
        )  # fmt: skip


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def test_a_busy_job_alone_reads_the_devices_figure_of_each_poll(card: Card) -> None:
    """Job 1: alone, each poll's device figure is its demand: about 0.9 over its run (its
    first poll caught CUDA starting up), not what a figure smoothed over the quiet card
    before it says."""
    card.quiet(10)
    job = card.start("train-c")
    for device in BUSY_ALONE:
        card.poll(device, {job.id: device})
    assert card.monitor.job_demand(job.id) == pytest.approx(_mean(BUSY_ALONE) / 100, abs=0.01)


def test_two_busy_jobs_sharing_from_their_start_are_contended_not_starved(card: Card) -> None:
    """Jobs 3 and 4: neither's half of the card is recorded as its demand; both count as
    busy (each took its turn's worth of a saturated card), and the hint names contention
    and the other job, never the data loader."""
    card.quiet(10)
    first, second = card.start("train-c"), card.start("train-c")
    for device, a, b in zip(PAIR_DEVICE, *PAIR_OWN, strict=True):
        card.poll(device, {first.id: a, second.id: b})
    for job, other in ((first, second), (second, first)):
        tracker = card.monitor.live(job.id)
        assert tracker is not None
        assert tracker.sharing.measured_demand() is None
        assert card.monitor.job_demand(job.id) == 1.0
        facts = card.end(job)
        hints = job_hints(facts, min_runtime_s=10)
        assert not any("waits for data" in h or "mostly waits" in h for h in hints), hints
        assert any(f"job {other.id}" in h for h in hints), hints


def test_a_light_job_alone_after_its_busy_neighbours_end_reads_light(card: Card) -> None:
    """Job 5: a light loop beside the busy pair, then alone for its last polls: those polls
    read the card as it is now (about 1 %), not the pair's 100 % fading out."""
    busy = card.start("train-c")
    light = card.start("loader-s")
    for _ in range(8):
        card.poll(100.0, {busy.id: 97.0, light.id: None})
    card.end(busy)
    for _ in range(4):
        card.poll(1.0, {light.id: 1.0})
    demand = card.monitor.job_demand(light.id)
    assert demand is not None and demand < 0.05


def test_a_run_that_has_just_ended_is_the_history_of_the_next(store: Store, card: Card) -> None:
    """Jobs 1 and 3-4: the history a pass reads is kept for a minute; a run of the same
    script that ended meanwhile must count at once, or the next run of a busy script is
    taken for one of unknown demand and put beside another busy job."""
    job = card.start("train-c")
    assert card.monitor.expected_demand(job) is None  # a pass read the (empty) history
    for device in BUSY_ALONE:
        card.poll(device, {job.id: device})
    card.end(job)
    again = store.jobs.add(
        NewJob(user="alice", uid=1000, gid=1000, command=["python", "other.py"], cwd="/",
               env={}, umask=0o022, mem=4 * GiB, name="train-c"),
        LATER,
    )  # fmt: skip
    expected = card.monitor.expected_demand(again)
    assert expected == pytest.approx(_mean(BUSY_ALONE) / 100, abs=0.01)
    # Another user's runs of a script with that name are not this one's history.
    theirs = store.jobs.add(
        NewJob(user="bob", uid=1001, gid=1001, command=["python", "other.py"], cwd="/",
               env={}, umask=0o022, mem=4 * GiB, name="train-c"),
        LATER,
    )  # fmt: skip
    assert card.monitor.expected_demand(theirs) is None
