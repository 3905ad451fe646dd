"""Issue 24's placement findings, one `Scheduler.tick()` at a time (the World harness of
tests/test_tick.py): the head's claim by memory, stored and kept; big cards for big jobs;
topology; true reasons; fair share within a pass; what can never run refused at submit."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from gpusched.cli.render import render_gpus
from gpusched.core.errors import UsageError
from gpusched.core.models import GpuHealth, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.context import Context
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import Store
from tests.fakes import FakeProbe, GiB
from tests.test_tick import make_world

MINUTE = 60


def test_the_head_waits_for_the_card_that_frees_first_not_a_multi_day_job(tmp_path: Path) -> None:
    """Item 1: a multi-day 20G job on GPU 0; `train` (20G, --after prep) becomes head after
    a newer short job started on GPU 1; 10G jobs arrive every 2 minutes and run 3."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    long = world.submit(20 * GiB)
    world.tick()
    prep = world.submit(1 * GiB)
    world.tick()
    train = world.submit(20 * GiB, after=(prep,))
    short = world.submit(10 * GiB)
    world.tick()
    assert world.gpus_of(long) == [0]
    assert world.gpus_of(short) == [1]
    world.finish(prep)
    # Each job runs 3 min once started; `short` has 1 min left, so that GPU 1 always runs
    # one job or two and is never empty by chance.
    ends = {short: world.clock.now.timestamp() + MINUTE}
    reasons = []
    for minute in range(120):  # two hours, a pass a minute
        now = world.clock.now.timestamp()
        for job_id, end in list(ends.items()):
            if end <= now:
                world.finish(job_id)
                del ends[job_id]
        if minute % 2 == 0:
            ends[world.submit(10 * GiB)] = float("inf")
        world.tick()
        for job_id, end in ends.items():
            if end == float("inf") and world.state(job_id) == JobState.RUNNING:
                ends[job_id] = now + 3 * MINUTE
        if world.state(train) == JobState.RUNNING:
            break
        reasons.append(world.job(train).waiting_reason or "")
        world.clock.advance(MINUTE - 2)
    assert world.state(train) == JobState.RUNNING
    assert world.gpus_of(train) == [1]
    assert reasons
    assert all("GPU 1 kept for it" in r for r in reasons)
    assert f"job {short}" in reasons[0]
    assert world.state(long) == JobState.RUNNING  # it never had to end


def test_the_heads_claim_is_stored_and_survives_a_restart(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    first, second = world.submit(20 * GiB), world.submit(10 * GiB)
    world.tick()
    head = world.submit(20 * GiB)
    world.tick()
    stored = world.scheduler.store.head_claims.current()
    assert stored is not None
    assert stored.job_id == head
    assert stored.gpu_uuids == (world.probe.uuid(1),)  # 10G to free there, not 20G
    # A new daemon on the same database keeps the same card for the same head.
    config = world.scheduler.context.settings
    again = Scheduler(
        Context.build(
            config,
            Store(config.current.database_url),
            world.probe,
            world.launcher,
            clock=world.clock,
        )
    )
    again.adopt_running()
    again.tick()
    assert again.store.head_claims.current() == stored
    assert "GPU 1 kept for it" in (again.decorate(again.store.jobs.get(head)).waiting_reason or "")
    again.store.close()
    world.finish(second)
    world.tick()
    assert world.gpus_of(head) == [1]
    assert world.scheduler.store.head_claims.current() is None
    assert world.state(first) == JobState.RUNNING


def test_a_small_job_starts_beside_a_head_that_still_fits(tmp_path: Path) -> None:
    """Item 2: one 48G card running 40G, the head needs 20G: a 4G job was refused
    ("GPUs kept for job 2") though the head still fits once the 40G job ends."""
    world = make_world(tmp_path, [48 * GiB])
    big = world.submit(40 * GiB)
    world.tick()
    head = world.submit(20 * GiB)
    small = world.submit(4 * GiB)
    world.tick()
    assert world.state(head) == JobState.QUEUED
    assert world.state(small) == JobState.RUNNING
    world.finish(big)
    world.tick()
    assert world.state(head) == JobState.RUNNING


def test_small_jobs_take_the_small_cards_and_the_pair_starts(tmp_path: Path) -> None:
    """Item 3: cards 24, 24, 80, 80; two 20G jobs and a `--gpus 2 --mem 70G` job together."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB, 80 * GiB, 80 * GiB])
    a, b = world.submit(20 * GiB), world.submit(20 * GiB)
    pair = world.submit(70 * GiB, gpus=2)
    world.tick()
    assert sorted(world.gpus_of(a) + world.gpus_of(b)) == [0, 1]
    assert world.gpus_of(pair) == [2, 3]


class SwitchedProbe(FakeProbe):
    """The fake GPUs with a topology: 0-1 and 2-3 each share a PCIe switch."""

    def topology(self) -> dict[str, dict[str, int]]:
        return {
            a.uuid: {b.uuid: 10 if a.index // 2 == b.index // 2 else 30 for b in self.gpus}
            for a in self.gpus
        }


def test_a_two_gpu_job_gets_the_pair_on_one_switch(tmp_path: Path) -> None:
    """Item 4: a small job on GPU 0, a 2-GPU job got [1, 2] while 2 and 3 were free."""
    world = make_world(tmp_path, [24 * GiB] * 4, probe=SwitchedProbe([24 * GiB] * 4))
    small = world.submit(2 * GiB)
    world.tick()
    assert world.gpus_of(small) == [0]
    pair = world.submit(8 * GiB, gpus=2)
    world.tick()
    assert world.gpus_of(pair) == [2, 3]


def test_a_whole_gpu_job_does_not_start_where_others_hold_most_of_the_card(
    tmp_path: Path,
) -> None:
    """Item 9: outside processes hold 22 of 24G; a job with no --mem started there."""
    world = make_world(tmp_path, [24 * GiB])
    world.probe.hold(4242, 0, 22 * GiB)
    whole = world.submit(None)
    world.tick()
    assert world.state(whole) == JobState.QUEUED
    assert "other processes hold 22G of 24G" in (world.job(whole).waiting_reason or "")


def test_a_job_held_back_by_max_jobs_per_gpu_is_told_so(tmp_path: Path) -> None:
    """Item 13: it was told "most available is 22.0G"."""
    world = make_world(tmp_path, [24 * GiB], max_jobs_per_gpu=1)
    first = world.submit(2 * GiB)
    world.tick()
    second = world.submit(2 * GiB)
    world.tick()
    assert world.state(first) == JobState.RUNNING
    reason = world.job(second).waiting_reason or ""
    assert "max_jobs_per_gpu 1" in reason
    assert "most available" not in reason


def test_a_user_with_no_recent_use_cannot_take_every_slot_in_one_pass(tmp_path: Path) -> None:
    """Item 14: 30 jobs of a user with no use, 12 slots; the light user's one job waited.
    (Memory alone decides here: under `pack: contention` new jobs of unknown demand start
    at most two to a card per pass until measured, issue 25's rule 3c.)"""
    world = make_world(tmp_path, [24 * GiB] * 3, pack="memory")
    earlier = world.submit(1 * GiB, user="bob")
    world.tick()
    world.clock.advance(MINUTE)
    world.finish(earlier)
    world.tick()
    flood = [world.submit(6 * GiB, user="alice") for _ in range(30)]
    light = world.submit(6 * GiB, user="bob")
    world.tick()
    assert world.state(light) == JobState.RUNNING
    assert sum(world.state(j) == JobState.RUNNING for j in flood) == 11


def test_a_multi_gpu_job_needs_that_many_cards_able_to_hold_its_memory(tmp_path: Path) -> None:
    """Item 8: `--mem 30G --gpus 2` on 80G + 24G was accepted and waited forever."""
    world = make_world(tmp_path, [80 * GiB, 24 * GiB])
    with pytest.raises(UsageError, match=r"--gpus 2: only 1 GPU\(s\) of this server can hold"):
        world.submit(30 * GiB, gpus=2)
    assert world.submit(20 * GiB, gpus=2)  # both cards can hold 20G


def test_after_an_oom_retried_job_names_the_retry(tmp_path: Path) -> None:
    """Item 13: `--after` a job that ran out of memory and was retried said "waiting for
    job 1" (job 1 had failed; its retry was the job it waited for)."""
    world = make_world(tmp_path, [24 * GiB])
    first = world.submit(8 * GiB, retry_oom=1)
    world.tick()
    after = world.submit(2 * GiB, after=(first,))
    world.launcher.log_path(first).write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    world.finish(first, Outcome(OutcomeKind.EXIT, exit_code=1))
    retry = world.scheduler.store.jobs.latest_attempts([first])[first].id
    world.tick()
    reason = world.job(after).waiting_reason or ""
    assert f"retried as job {retry}" in reason


def test_a_known_peak_stays_reserved_after_the_job_drops(tmp_path: Path) -> None:
    """Item 11: declared 8G, seen at 16G, down to 2G: a 14G job was placed beside it
    (30G on a 24G card at its next peak). It reserves max(declared, peak seen)."""
    world = make_world(tmp_path, [24 * GiB])
    job = world.submit(8 * GiB)
    world.tick()
    pid = world.launcher.running[job]
    world.probe.hold(pid, 0, 16 * GiB)
    world.tick()
    world.probe.hold(pid, 0, 2 * GiB)
    world.tick()
    beside = world.submit(14 * GiB)
    world.tick()
    assert world.state(beside) == JobState.QUEUED
    fits = world.submit(8 * GiB)  # 24 - 16 = 8G is what is left
    world.tick()
    assert world.state(fits) == JobState.RUNNING


def test_memory_on_a_gpu_the_job_was_not_given_is_an_overrun(tmp_path: Path) -> None:
    """Item 12: it went unnoticed, even with `overrun: kill`, and status counted it as
    gpusched jobs' memory on that card with no job listed there."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB], overrun="kill")
    job = world.submit(4 * GiB)
    world.tick()
    assert world.gpus_of(job) == [0]
    world.probe.hold(world.launcher.running[job], 1, 2 * GiB)
    world.tick()
    assert world.launcher.stop_requests == [job]
    report = world.scheduler.gpu_reports(world.scheduler.store.jobs.running())[1]
    assert report.jobs == [job]
    world.finish(job, Outcome(OutcomeKind.CANCELLED))
    ended = world.job(job)
    assert "GPU 1, a GPU it was not given" in (ended.reason_detail or "")


def test_losing_and_regaining_a_gpu_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 13: losing and regaining a GPU wrote nothing to the daemon's log."""
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    world.tick()
    healthy = world.probe.gpus[1]
    world.probe.gpus[1] = replace(healthy, health=GpuHealth.LOST, error="fell off the bus")
    with caplog.at_level(logging.INFO, logger="gpusched.scheduler"):
        world.tick()
        world.tick()  # still lost: said once
        world.probe.gpus[1] = healthy
        world.tick()
    lines = [r.getMessage() for r in caplog.records if r.name == "gpusched.scheduler"]
    assert [line for line in lines if "lost" in line] == [
        f"GPU 1 ({healthy.uuid}) lost: fell off the bus; no job starts on it"
    ]
    assert f"GPU 1 ({healthy.uuid}) is back (ok)" in lines


def test_a_card_short_of_its_reservations_says_so_in_status(tmp_path: Path) -> None:
    """Item 13: a card short of its reservations showed a full bar, no word of it."""
    world = make_world(tmp_path, [24 * GiB])
    job = world.submit(16 * GiB)
    world.tick()  # launched, not allocated yet: 16G reserved
    world.probe.hold(4242, 0, 12 * GiB)  # another process takes 12G meanwhile
    world.tick()
    report = world.scheduler.gpu_reports(world.scheduler.store.jobs.running())[0]
    assert report.jobs == [job]
    assert report.short == 4 * GiB
    lines = render_gpus([report])
    assert any("GPU 0 is 4G short of its jobs' reservations" in line for line in lines)
