"""Rule 3 (issue 25's contention rule) one `Scheduler.tick()` at a time (tests/world.py):
each job's GPU demand comes from what was measured of its earlier runs (`--name`, sweep or
command: UsageMonitor.expected_demand), a busy job waits for a quieter card however long
it was queued before (its wait counted from the first pass that held it), and the card it
keeps for that is its own once its busy jobs end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.cli.show_view import show_json, show_lines
from gpusched.core.clock import iso
from gpusched.core.models import JobState
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.store import NewJob
from gpusched.usage.monitor import HISTORY_TTL_S
from tests.fakes import GiB
from tests.world import World, make_cluster, make_world

ALICE = Caller(pid=101, uid=1000, gid=1000, user="alice", admin=False)
BUSY = 0.95  # a compute-bound training loop (FIELD.md: 95-98 % alone)
LIGHT = 0.05  # a job that waits on data most of the time


def past_run(world: World, name: str, demand: float) -> None:
    """An earlier run of a job called `name` (another script) that was measured at
    `demand` and has ended: what the history of a job with that --name says."""
    earlier = world.scheduler.submit(
        NewJob(
            user="alice",
            uid=1000,
            gid=1000,
            command=["earlier.py"],
            cwd="/",
            env={},
            umask=0o022,
            mem=1 * GiB,
            name=name,
        )
    ).id
    world.tick()
    assert world.state(earlier) == JobState.RUNNING
    world.finish(earlier)
    world.tick()
    assert world.state(earlier) == JobState.DONE
    world.scheduler.store.usage.set_usage(earlier, demand=demand)
    world.clock.advance(HISTORY_TTL_S + 1)  # the daemon reads the history once a minute


def test_two_busy_jobs_with_history_go_to_different_cards(tmp_path: Path) -> None:
    """Their history says both are busy, a light job runs on one card: each busy job
    takes a card of its own (one beside the light job), not both the roomier card."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    light = world.submit(30 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == [0]
    first = world.submit(20 * GiB, name="busy")
    second = world.submit(20 * GiB, name="busy")
    world.tick()
    assert world.state(first) == world.state(second) == JobState.RUNNING
    assert sorted(world.gpus_of(first) + world.gpus_of(second)) == [0, 1]


def test_a_light_job_goes_beside_a_busy_one(tmp_path: Path) -> None:
    """History ~5 %: it shares the busy job's card, not the roomier card whose job's
    demand is unknown (counted busy)."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    busy = world.submit(20 * GiB, name="busy")
    world.tick()
    unknown = world.submit(10 * GiB, name="new")
    world.tick()
    assert (world.gpus_of(busy), world.gpus_of(unknown)) == ([0], [1])
    light = world.submit(5 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == [0]


def test_a_busy_job_waits_for_a_quieter_card_counted_from_when_it_was_first_held(
    tmp_path: Path,
) -> None:
    """A busy job that sat in the queue (held) far longer than ten minutes still waits for
    a quieter card once it may start (it used to join a busy card at once: its wait was
    counted from its submit), and its reason counts the wait from the first pass that
    held it for one."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    assert sorted(g for job in running for g in world.gpus_of(job)) == [0, 1]
    late = world.submit(20 * GiB, name="busy")
    assert world.scheduler.store.jobs.hold(late)
    world.clock.advance(3 * 3600)  # long queued
    world.tick()
    assert world.scheduler.store.jobs.release(late)
    world.tick()
    assert world.state(late) == JobState.QUEUED
    why = world.job(late).waiting_reason or ""
    assert "waits for a quieter card" in why and "so far" not in why
    world.clock.advance(20 * 60)
    world.tick()
    assert world.state(late) == JobState.QUEUED  # no time limit makes it share
    why = world.job(late).waiting_reason or ""
    assert "for 20 min so far" in why  # not 3 h: counted from when it was first held


def test_the_card_kept_for_a_busy_job_takes_no_other_and_is_its_own_once_quiet(
    tmp_path: Path,
) -> None:
    """The bound: the held job keeps the card whose busy job ends first (by --time); a
    light job submitted after it starts elsewhere, not there; the busy job there ends and
    the held job starts on it."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "light", LIGHT)
    long = world.submit(20 * GiB, name="busy")
    short = world.submit(20 * GiB, name="busy", time_limit_s=1800)
    world.tick()
    assert sorted(world.gpus_of(long) + world.gpus_of(short)) == [0, 1]
    late = world.submit(20 * GiB, name="busy")
    world.tick()
    assert world.state(late) == JobState.QUEUED
    kept = world.gpus_of(short)[0]
    why = world.job(late).waiting_reason or ""
    assert f"GPU {kept} kept for it: starts when busy job {short} ends (by --time" in why
    light = world.submit(5 * GiB, name="light")
    world.tick()
    assert world.gpus_of(light) == world.gpus_of(long)  # beside the other busy job
    world.clock.advance(1200)
    world.finish(short)
    world.tick()
    assert world.state(late) == JobState.RUNNING
    assert world.gpus_of(late) == [kept]


@pytest.mark.parametrize("placer", ["local", "cluster"])
def test_both_placers_feed_the_demand_and_hold_a_busy_job(tmp_path: Path, placer: str) -> None:
    """One server's placer and a cluster's elected scheduler alike (pass_rules.decide): the
    running jobs' demands as their measurement stored them, the waiting job's from its
    history; a third busy job waits for a quieter card."""
    sizes = [80 * GiB, 80 * GiB]
    world = (
        make_world(tmp_path, sizes)
        if placer == "local"
        else make_cluster(tmp_path, ["a"], sizes)[0]
    )
    running = [world.submit(20 * GiB, name="busy") for _ in range(2)]
    world.tick()
    world.tick()
    assert sorted(g for job in running for g in world.gpus_of(job)) == [0, 1]
    for job in running:  # as the usage monitor's flush writes a running job's figures
        world.scheduler.store.usage.set_usage(job, demand=BUSY)
    world.clock.advance(HISTORY_TTL_S + 1)
    late = world.submit(20 * GiB, name="busy")
    world.tick()
    world.tick()
    assert world.state(late) == JobState.QUEUED
    assert "waits for a quieter card" in (world.job(late).waiting_reason or "")


def test_a_light_job_waits_for_a_card_that_stays_within_its_busy_time(tmp_path: Path) -> None:
    """Rule 3c for light jobs (pack25): history 30 %, both cards run a busy job (95 %):
    beside either it would pass 100 % and stretch both, so it waits, and its reason says
    so; once one busy job ends it starts on that card."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    past_run(world, "busy", BUSY)
    past_run(world, "medium", 0.3)
    busy = [world.submit(20 * GiB, name="busy"), world.submit(20 * GiB, name="busy")]
    world.tick()
    assert sorted(world.gpus_of(busy[0]) + world.gpus_of(busy[1])) == [0, 1]
    light = world.submit(5 * GiB, name="medium")
    world.tick()
    assert world.state(light) == JobState.QUEUED
    assert "no card stays within 100 % with it" in (world.job(light).waiting_reason or "")
    world.finish(busy[1])
    world.tick()
    assert world.gpus_of(light) == world.gpus_of(busy[1])


def test_new_jobs_of_unknown_demand_start_at_most_two_to_a_card_per_pass(
    tmp_path: Path,
) -> None:
    """Rule 3c for jobs with no history (pack25): counted busy once placed in a pass, a
    card with two of them is full for the rest of that pass, so a flood of a new script
    does not pile on the cards before a poll has measured any of it; the next pass (those
    running, not measured yet, count for nothing) starts more."""
    world = make_world(tmp_path, [24 * GiB] * 2)
    flood = [world.submit(2 * GiB, name="new") for _ in range(10)]
    world.tick()
    assert sum(world.state(j) == JobState.RUNNING for j in flood) == 4
    world.tick()
    assert sum(world.state(j) == JobState.RUNNING for j in flood) == 8


def test_a_new_project_is_expected_busy_when_its_owners_last_five_runs_were(
    tmp_path: Path,
) -> None:
    """The owner prior through the store's real usage records: alice's latest 5 ended runs
    were all busy, so her job of a new project (no same --name, sweep or command) counts
    as busy and waits for a quieter card while both cards run a busy job, told why; bob's
    new job, whose owner has no runs, is unknown and starts beside a busy job as before.
    A sixth, light run of alice's makes her runs mixed: her next new job starts too."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    for _ in range(5):
        past_run(world, "busy", BUSY)
    busy = [world.submit(20 * GiB, name="busy"), world.submit(20 * GiB, name="busy")]
    world.tick()
    assert sorted(world.gpus_of(busy[0]) + world.gpus_of(busy[1])) == [0, 1]
    new = world.submit(10 * GiB, name="new-project")
    world.tick()
    assert world.state(new) == JobState.QUEUED
    why = world.job(new).waiting_reason or ""
    assert why.startswith(
        "waits for a quieter card (expected busy: its owner's last 5 jobs were, and it has no runs"
        " of its own yet (--share if it is not): it keeps a card 95% busy;"
    )
    bobs = world.submit(10 * GiB, user="bob", name="new-project")
    world.tick()
    assert world.state(bobs) == JobState.RUNNING  # nothing known of it: not held
    # A light run of alice's ends (another project's, on another server of hers): her
    # latest five are four busy and one light, mixed: nothing is known of the new job.
    light = world.scheduler.store.jobs.add(
        NewJob(
            user="alice", uid=1000, gid=1000, command=["light.py"], cwd="/", env={},
            umask=0o022, mem=1 * GiB, name="light",
        ),
        iso(world.clock()),
    )  # fmt: skip
    world.clock.advance(60)
    assert world.scheduler.store.jobs.mark_ended(
        light.id, state=JobState.DONE, reason="exited", now=iso(world.clock()),
        usage={"demand": LIGHT},
    )  # fmt: skip
    world.clock.advance(HISTORY_TTL_S + 1)
    world.tick()
    assert world.state(new) == JobState.RUNNING


def test_show_says_a_waiting_jobs_expected_demand_and_whose_runs_it_comes_from(
    tmp_path: Path,
) -> None:
    """`show` (the handler's reply and the CLI's lines) of a waiting job: what rule 3
    counts it as from history, said as history: its owner's latest runs for a new
    project, its own earlier runs for a known one; nothing for a job nothing is known of."""
    world = make_world(tmp_path, [80 * GiB, 80 * GiB])
    for _ in range(5):
        past_run(world, "busy", BUSY)
    busy = [world.submit(20 * GiB, name="busy"), world.submit(20 * GiB, name="busy")]
    world.tick()
    new = world.submit(10 * GiB, name="new-project")
    known = world.submit(10 * GiB, name="busy")
    bobs = world.submit(70 * GiB, user="bob", name="new-project")  # fits nowhere: waits
    world.tick()
    assert {world.state(j) for j in (new, known, bobs)} == {JobState.QUEUED}
    scheduler = world.scheduler
    services = Services(scheduler, scheduler.store, scheduler.context.settings, 0)

    def show(job_id: int) -> dict[str, object]:
        return dispatch(services, ALICE, {"op": "show", "id": job_id})

    reply = show(new)
    assert (reply["expected_demand"], reply["expected_from_owner_runs"]) == (BUSY, 5)
    lines = show_lines(reply, 200)
    assert (
        "gpu demand: expected busy, 0.95 of a GPU's busy time: its owner's last 5 jobs were"
        " busy, and it has no runs of its own yet (--share if it is not)"
    ) in [" ".join(line.split()) for line in lines]
    waiting = next(line for line in lines if line.startswith("waiting"))
    assert "expected busy: its owner's last 5 jobs were" in waiting
    assert json.loads(show_json(reply))["expected_from_owner_runs"] == 5
    reply = show(known)
    assert (reply["expected_demand"], reply["expected_from_owner_runs"]) == (BUSY, 0)
    shown = show_lines(reply, 200)
    assert any("expected 0.95 of a GPU's busy time (its earlier runs)" in x for x in shown)
    reply = show(bobs)
    assert "expected_demand" not in reply
    assert not any("gpu demand" in line for line in show_lines(reply, 200))
    for job in busy:
        world.finish(job)
    world.tick()
    world.tick()
    assert world.state(new) == JobState.RUNNING
    assert "expected_demand" not in show(new)  # running: its own figure, once measured


def test_a_busy_job_takes_a_quiet_big_card_where_the_bigger_waiting_job_still_fits(
    tmp_path: Path,
) -> None:
    """Rule 2 would keep the 80G card for bob's 70G job (his `max_running` holds it back)
    and send the busy 8G job beside the busy one on the 24G card; the 80G card is quiet
    and the 70G job still fits there beside the 8G one, so it goes there, delaying none."""
    bob_runs_one = {"users": {"bob": {"max_running": 1}}}
    world = make_world(tmp_path, [24 * GiB, 80 * GiB], limits=bob_runs_one)
    past_run(world, "busy", BUSY)
    first = world.submit(10 * GiB, name="busy")
    big = world.submit(70 * GiB, name="big")
    small = world.submit(1 * GiB, user="bob", share=True)
    world.tick()
    assert (world.gpus_of(first), world.gpus_of(big)) == ([0], [1])  # rule 2 for the 70G one
    assert world.state(small) == JobState.RUNNING
    world.finish(big)
    world.tick()
    bigger = world.submit(70 * GiB, user="bob")  # waits for bob's max_running
    busy = world.submit(8 * GiB, name="busy")
    world.tick()
    assert world.state(bigger) == JobState.QUEUED
    assert world.gpus_of(busy) == [1]
