"""Fair share charges max(declared, measured) over time (issue 24 finding 10, issue 27 item 6).

Driven one `Scheduler.tick()` at a time (tests/test_tick.py's world): the fake GPUs show
what each job really holds, the clock moves only when told. Before, a user who declared
256M and used 12G was charged for 256M, and then won the next card over a user who
declared and used 10G.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.models import JobState
from gpusched.scheduling.fair_share import usage_by_user
from tests.fakes import GiB
from tests.test_tick import World, make_world

MiB = 2**20


def _run_for(world: World, jobs_held: dict[int, int], seconds: int) -> None:
    """Let the jobs hold these bytes on their GPU for `seconds`, then end them."""
    for job, held in jobs_held.items():
        world.probe.hold(world.launcher.running[job], world.gpus_of(job)[0], held)
    for _ in range(seconds // 60):
        world.tick()
        world.clock.advance(58)  # tick() moves it 2 s
    for job in jobs_held:
        pid = world.launcher.running[job]
        world.finish(job)
        world.probe.held = {k: v for k, v in world.probe.held.items() if k[0] != pid}


def test_a_user_who_declared_little_and_used_much_is_charged_what_was_used(
    tmp_path: Path,
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    light_declared = world.submit(256 * MiB, user="alice")
    honest = world.submit(10 * GiB, user="bob")
    world.tick()
    assert world.state(light_declared) == world.state(honest) == JobState.RUNNING
    _run_for(world, {light_declared: 12 * GiB, honest: 10 * GiB}, 600)

    usage = usage_by_user(
        world.scheduler.store.jobs, {world.probe.uuid(0): 24 * GiB}, world.clock(), 3600.0
    )
    assert usage["alice"] > usage["bob"]  # 12G for 10 minutes against 10G for 10 minutes
    assert usage["alice"] / usage["bob"] > 1.19

    # Both want the card now; only one fits (8G + 20G > 24G): the one who used less goes first.
    alice_next = world.submit(8 * GiB, user="alice")
    bob_next = world.submit(20 * GiB, user="bob")
    world.tick()
    assert world.state(bob_next) == JobState.RUNNING
    assert world.state(alice_next) == JobState.QUEUED


def test_an_honest_job_that_used_less_than_it_declared_pays_for_what_it_kept(
    tmp_path: Path,
) -> None:
    world = make_world(tmp_path, [24 * GiB])
    kept = world.submit(16 * GiB, user="alice")
    world.tick()
    _run_for(world, {kept: 4 * GiB}, 600)
    used = world.submit(4 * GiB, user="bob")
    world.tick()
    _run_for(world, {used: 16 * GiB}, 600)
    usage = usage_by_user(
        world.scheduler.store.jobs, {world.probe.uuid(0): 24 * GiB}, world.clock(), 3600.0
    )
    # The same 16G for the same 10 minutes each; alice's are ten minutes older: 2^(-1/6).
    assert usage["alice"] / usage["bob"] == pytest.approx(2 ** (-600 / 3600), rel=0.02)
