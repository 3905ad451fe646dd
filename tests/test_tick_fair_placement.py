"""Placement that cannot be gamed or fooled, one `Scheduler.tick()` at a time
(tests/world.py): a job that needs a card to itself is not starved by a stream of small
jobs, what the daemon measured outranks what a job says of itself, memory another process
took is not blamed on the job it starved, and the waiting reasons say what is true."""

from __future__ import annotations

import getpass
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpusched.cli.show_view import show_lines
from gpusched.core.models import GpuState, JobState
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.processes.pidref import process_start_time
from gpusched.store import NewJob
from gpusched.usage.monitor import HISTORY_TTL_S
from tests.fakes import FakeProbe, GiB
from tests.world import World, make_world

ALICE = Caller(pid=101, uid=1000, gid=1000, user="alice", admin=False)

# A small job of the stream runs this many passes (each a tick, 2 s) once started.
SMALL_RUNS = 4


def feed_until_started(
    world: World, head: int, smalls: list[int], passes: int = 40
) -> tuple[bool, list[str]]:
    """Run `passes` passes; each small job runs SMALL_RUNS passes and is then replaced by a
    new one (the first ones end one pass apart, so the card is never empty of them by
    chance). Whether `head` started, and its reason at each pass before."""
    started = {job: -k for k, job in enumerate(smalls)}
    reasons: list[str] = []
    for step in range(passes):
        for job in list(smalls):
            if world.state(job) != JobState.RUNNING:
                continue
            if step - started.setdefault(job, step) >= SMALL_RUNS:
                world.finish(job)
                smalls.remove(job)
                smalls.append(world.submit(2 * GiB))
        world.tick()
        if world.state(head) == JobState.RUNNING:
            return True, reasons
        reasons.append(world.job(head).waiting_reason or "")
    return False, reasons


@pytest.mark.parametrize(
    ("cards", "ask"),
    [
        (1, {"mem": 10 * GiB, "exclusive": True}),
        (2, {"mem": 4 * GiB, "gpus": 2, "exclusive": True}),
        (2, {"mem": None, "gpus": 2}),
    ],
    ids=["exclusive", "exclusive-two-gpus", "two-whole-gpus"],
)
def test_a_job_that_needs_a_card_to_itself_starts_behind_a_stream_of_small_jobs(
    tmp_path: Path, cards: int, ask: dict[str, Any]
) -> None:
    """Four 2G jobs a card kept running; the head's claim was sized by memory only, so
    each new small job started beside the `--exclusive` head, which never started while
    its reason said its card was kept for it."""
    world = make_world(tmp_path, [24 * GiB] * cards, pack="memory")
    smalls = [world.submit(2 * GiB) for _ in range(4 * cards)]
    world.tick()
    head = world.submit(**ask)
    started, reasons = feed_until_started(world, head, smalls)
    assert started, reasons[-1]
    # Its reason was true at every pass: it waits for the jobs on its cards to end.
    assert reasons
    assert all("kept for it: starts when" in r for r in reasons), reasons
    if ask.get("exclusive"):
        assert all("with --exclusive" in r for r in reasons)


def test_a_job_whose_time_ends_first_may_still_start_beside_an_exclusive_head(
    tmp_path: Path,
) -> None:
    """The backfill rule used for memory: a job whose `--time` ends before the head could
    start does not delay it."""
    world = make_world(tmp_path, [24 * GiB], pack="memory")
    first = world.submit(2 * GiB, time_limit_s=600)
    world.tick()
    head = world.submit(10 * GiB, exclusive=True)
    world.tick()
    quick, slow = world.submit(2 * GiB, time_limit_s=300), world.submit(2 * GiB)
    world.tick()
    assert world.state(head) == JobState.QUEUED
    assert world.state(quick) == JobState.RUNNING
    assert world.state(slow) == JobState.QUEUED
    world.tick()
    reason = world.job(head).waiting_reason or ""
    assert f"starts when jobs {first}, {quick} end (by --time" in reason
    world.finish(first)
    world.finish(quick)
    world.tick()
    assert world.state(head) == JobState.RUNNING
    assert world.state(slow) == JobState.QUEUED


class BusyProbe(FakeProbe):
    """The fake GPUs, each reading the utilization the test sets (`util`: index -> %)."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sizes)
        self.util: dict[int, int] = {}

    def snapshot(self) -> list[GpuState]:
        return [replace(g, util_percent=self.util.get(g.index, 0)) for g in super().snapshot()]


def measured(world: World, probe: BusyProbe, job: int, index: int, percent: int) -> None:
    """`job` holds 4G on GPU `index`, alone there at `percent` busy, for the polls the
    daemon needs to know its demand."""
    probe.hold(world.launcher.running[job], index, 4 * GiB)
    probe.util[index] = percent
    for _ in range(4):
        world.tick()


def ended_run(world: World, name: str, demand: float, **spec: Any) -> None:
    """An earlier run called `name`, measured at `demand`, that has ended (its history)."""
    earlier = world.submit(1 * GiB, name=name, **spec)
    world.tick()
    world.finish(earlier)
    world.tick()
    world.scheduler.store.usage.set_usage(earlier, demand=demand)
    world.clock.advance(HISTORY_TTL_S + 1)  # the daemon reads the history once a minute


def test_a_share_job_measured_busy_counts_as_busy(tmp_path: Path) -> None:
    """A `--share` job the daemon measured 97 % busy counted as no demand at all, so a
    busy job was placed beside it (each then runs at half speed)."""
    probe = BusyProbe([80 * GiB])
    world = make_world(tmp_path, [], probe=probe)
    ended_run(world, "train", 0.95)
    shared = world.submit(4 * GiB, name="sim", share=True)
    world.tick()
    measured(world, probe, shared, 0, 97)
    busy = world.submit(10 * GiB, name="train")
    world.tick()
    assert world.state(busy) == JobState.QUEUED
    reason = world.job(busy).waiting_reason or ""
    assert "waits for a quieter card" in reason
    assert f"busy job {shared}" in reason


def test_later_share_jobs_of_a_kind_measured_busy_are_judged_by_the_measurement(
    tmp_path: Path,
) -> None:
    """The owner's next `--share` run of the same --name, its runs measured busy: judged
    busy (it waits for a quieter card), and its reason and `show` say why."""
    world = make_world(tmp_path, [80 * GiB])
    ended_run(world, "sim", 0.97, share=True)
    ended_run(world, "train", 0.95)
    busy = world.submit(10 * GiB, name="train")
    world.tick()
    assert world.state(busy) == JobState.RUNNING
    # A `--share` job nothing like it was measured stays light: it starts beside it.
    light = world.scheduler.submit(
        NewJob(
            user="alice", uid=1000, gid=1000, command=["notebook.py"], cwd="/", env={},
            umask=0o022, mem=4 * GiB, share=True,
        )
    ).id  # fmt: skip
    world.tick()
    assert world.state(light) == JobState.RUNNING, world.job(light).waiting_reason
    again = world.submit(4 * GiB, name="sim", share=True)
    world.tick()
    assert world.state(again) == JobState.QUEUED
    reason = world.job(again).waiting_reason or ""
    assert "waits for a quieter card" in reason
    assert "--share" in reason and "measured" in reason
    scheduler = world.scheduler
    services = Services(scheduler, scheduler.store, scheduler.context.settings, 0)
    lines = show_lines(dispatch(services, ALICE, {"op": "show", "id": again}), 200)
    demand = next(" ".join(x.split()) for x in lines if x.startswith("gpu demand"))
    assert "0.97" in demand and "--share" in demand


def test_an_exclusive_job_that_measures_light_keeps_its_card(tmp_path: Path) -> None:
    probe = BusyProbe([80 * GiB])
    world = make_world(tmp_path, [], probe=probe)
    alone = world.submit(4 * GiB, exclusive=True)
    world.tick()
    measured(world, probe, alone, 0, 3)
    beside = world.submit(4 * GiB, share=True)
    world.tick()
    assert world.state(beside) == JobState.QUEUED


def test_an_oom_caused_by_another_process_keeps_the_declared_mem(tmp_path: Path) -> None:
    """A process gpusched did not start grew from 2G to 30G on a 40G card; a job that had
    reached 10G of its declared 20G ran out of memory and was retried at 30G, although
    the daemon saw the card filled by that process. The retry keeps --mem 20G and waits
    for room, its reason naming the process's pid and owner, never its command line."""
    world = make_world(tmp_path, [40 * GiB])
    job = world.submit(20 * GiB, retry_oom=1)
    world.tick()
    other = os.getpid()  # a process that exists, so that its owner can be read
    world.probe.hold(other, 0, 2 * GiB)
    world.probe.hold(world.launcher.running[job], 0, 10 * GiB)
    world.tick()
    world.probe.hold(other, 0, 30 * GiB)
    world.tick()
    world.launcher.log_path(job).write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    world.probe.held.pop((world.launcher.running[job], world.probe.uuid(0)))
    world.finish(job, Outcome(OutcomeKind.EXIT, exit_code=1))
    retry = world.scheduler.store.jobs.latest_attempts([job])[job]
    assert retry.id != job
    assert retry.mem == 20 * GiB
    owner = getpass.getuser()
    detail = world.job(job).reason_detail or ""
    assert f"pid {other}" in detail and owner in detail
    world.tick()
    assert world.state(retry.id) == JobState.QUEUED
    reason = world.job(retry.id).waiting_reason or ""
    assert f"pid {other}" in reason and f"user {owner}" in reason
    assert "pytest" not in reason and "python" not in reason  # not its command line
    del world.probe.held[(other, world.probe.uuid(0))]
    world.tick()
    assert world.state(retry.id) == JobState.RUNNING


def test_an_interactive_job_is_not_judged_by_its_owners_batch_jobs(tmp_path: Path) -> None:
    """A 4G Jupyter kernel waited with 22G free on every card: "expected busy: your last 5
    jobs were", its owner's batch runs. Interactive jobs are light until their own polls
    say otherwise, and their history is kept apart from batch history."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    for _ in range(5):
        ended_run(world, "train", 0.95)
    busy = [world.submit(2 * GiB, name="train") for _ in range(2)]
    world.tick()
    assert sorted(g for job in busy for g in world.gpus_of(job)) == [0, 1]
    client = os.getpid()  # a live client process: the kernel's
    kernel = world.submit(
        4 * GiB, name="lab", client_pid=client, client_start_time=process_start_time(client)
    )
    world.tick()
    assert world.state(kernel) == JobState.RUNNING, world.job(kernel).waiting_reason


def test_a_reason_lists_a_few_job_ids_and_how_many_more(tmp_path: Path) -> None:
    """A whole-GPU head behind 18 small jobs listed all 18 ids on one status line."""
    world = make_world(tmp_path, [24 * GiB], pack="memory")
    smalls = [world.submit(1 * GiB) for _ in range(18)]
    world.tick()
    head = world.submit(None)
    world.tick()
    reason = world.job(head).waiting_reason or ""
    assert "and 13 more end" in reason, reason
    assert str(smalls[-1]) not in reason.split("jobs ")[-1].split(" and")[0].split(", ")


def test_the_max_jobs_per_gpu_reason_says_which_job_the_card_is_kept_for(
    tmp_path: Path,
) -> None:
    """It ended "GPU 0 kept for it" without saying for what."""
    world = make_world(tmp_path, [24 * GiB], max_jobs_per_gpu=1)
    first = world.submit(2 * GiB)
    world.tick()
    second = world.submit(2 * GiB)
    world.tick()
    reason = world.job(second).waiting_reason or ""
    assert reason.endswith(f"GPU 0 kept for it (job {second}): starts when job {first} ends")


def test_an_owner_prior_reason_is_phrased_for_any_reader(tmp_path: Path) -> None:
    """Another user read "expected busy: your last 5 jobs were" of alice's job."""
    world = make_world(tmp_path, [80 * GiB])
    for _ in range(5):
        ended_run(world, "train", 0.95)
    busy = world.submit(10 * GiB, name="train")
    world.tick()
    assert world.state(busy) == JobState.RUNNING
    new = world.scheduler.submit(
        NewJob(
            user="alice", uid=1000, gid=1000, command=["new.py"], cwd="/", env={},
            umask=0o022, mem=4 * GiB,
        )
    ).id  # fmt: skip
    world.tick()
    reason = world.job(new).waiting_reason or ""
    assert "expected busy: its owner's last 5 jobs were" in reason
    assert "your" not in reason
