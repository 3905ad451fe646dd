"""The cluster's roles one pass at a time: two or three daemons' schedulers on one SQLite
file and one fixed clock (tests/world.py `make_cluster`), spawning no process and never
sleeping. Fencing, declaring a node down, coming back, re-election and takeover are
decided here by the clock the test moves; tests/test_cluster.py keeps what needs real
daemons (processes, sockets, signals, PostgreSQL).

And the shared pass rules (scheduling.pass_rules) on both placers: a rule of one server's
pass holds in a cluster too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.models import EndReason, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.processes.pidref import process_start_time
from gpusched.scheduling.cluster.agent import ClusterAgent
from gpusched.store import NodeGuard, NodePlacement
from tests.fakes import GiB
from tests.world import World, make_cluster, make_world

NODE_TIMEOUT_S = 30.0  # the default: 15 passes of the test's 2 s


@pytest.fixture
def clients() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Interactive clients: real processes (the daemon knows a client by pid and start time)."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "60"]))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def _interactive(world: World, client: subprocess.Popen[bytes], **spec: Any) -> int:
    # In a cluster an interactive job runs where its client is (handlers/interactive.py).
    if world.scheduler.in_cluster:
        spec.setdefault("allowed_nodes", (world.scheduler.node_name,))
    return world.submit(
        GiB, client_pid=client.pid, client_start_time=process_start_time(client.pid), **spec
    )


def _one(placer: str, tmp_path: Path, **config: Any) -> World:
    if placer == "local":
        return make_world(tmp_path, [24 * GiB], **config)
    return make_cluster(tmp_path, ["a"], [24 * GiB], **config)[0]


def _agent(world: World) -> ClusterAgent:
    placer = world.scheduler.placer
    assert isinstance(placer, ClusterAgent)
    return placer


# -- the shared pass rules, on both placers ---------------------------------------------------


@pytest.mark.parametrize("placer", ["local", "cluster"])
@pytest.mark.parametrize("cap", [1, 2])
def test_interactive_max_per_user_holds_on_both_placers(
    tmp_path: Path, clients: Callable[[], subprocess.Popen[bytes]], placer: str, cap: int
) -> None:
    world = _one(placer, tmp_path, interactive={"max_per_user": cap})
    first = [_interactive(world, clients()) for _ in range(cap)]
    world.tick()
    over = _interactive(world, clients())
    bobs = _interactive(world, clients(), user="bob")
    world.tick()
    assert [world.state(j) for j in first] == [JobState.RUNNING] * cap
    assert world.state(bobs) == JobState.RUNNING  # the cap is each user's
    assert world.state(over) == JobState.QUEUED
    assert world.job(over).waiting_reason == (
        f"interactive limit: alice has {cap} running (interactive.max_per_user {cap})"
    )
    world.scheduler.interactive.finish(world.job(first[0]), 0, None)
    world.tick()
    assert world.state(over) == JobState.RUNNING


@pytest.mark.parametrize("placer", ["local", "cluster"])
def test_a_job_whose_dependency_failed_ends_and_a_dependent_one_says_why_it_waits(
    tmp_path: Path, placer: str
) -> None:
    world = _one(placer, tmp_path)
    first = world.submit(GiB)
    world.tick()
    waits = world.submit(GiB, after=(first,))
    world.tick()
    assert world.job(waits).waiting_reason == f"waiting for job {first}"
    world.finish(first, Outcome(OutcomeKind.EXIT, exit_code=1))
    world.tick()
    ended = world.job(waits)
    assert (ended.state, ended.reason) == (JobState.CANCELLED, EndReason.DEPENDENCY_FAILED)


@pytest.mark.parametrize("placer", ["local", "cluster"])
def test_a_running_exclusive_job_takes_no_other_job_on_both_placers(
    tmp_path: Path, placer: str
) -> None:
    world = _one(placer, tmp_path)
    alone = world.submit(4 * GiB, exclusive=True)
    world.tick()
    assert world.state(alone) == JobState.RUNNING
    beside = world.submit(4 * GiB)
    world.tick()
    world.tick()
    assert world.state(beside) == JobState.QUEUED
    assert "GPU 0" in (world.job(beside).waiting_reason or "")


@pytest.mark.parametrize("placer", ["local", "cluster"])
def test_time_backfill_beside_the_head_holds_on_both_placers(tmp_path: Path, placer: str) -> None:
    """The head's earliest start is known from the running job's --time: a job behind it
    whose own --time ends before then starts on its card (memory alone would not let it).
    The running job is `--share` (light): sharing slows neither past its --time."""
    world = _one(placer, tmp_path)
    running = world.submit(16 * GiB, time_limit_s=600, share=True)
    world.tick()
    assert world.state(running) == JobState.RUNNING
    head = world.submit(20 * GiB)
    world.tick()
    short = world.submit(6 * GiB, time_limit_s=60)  # 8G free, but only 4G spare for the head
    world.tick()
    world.tick()
    assert world.state(head) == JobState.QUEUED
    assert "within" in (world.job(head).waiting_reason or "")  # its start by --time
    assert world.state(short) == JobState.RUNNING


# -- two daemons on one database ------------------------------------------------------------


def _pair(tmp_path: Path, **config: Any) -> tuple[World, World]:
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], **config)
    a.tick()  # the first to pass is elected
    b.tick()  # b's GPUs are in its row from its first pass
    return a, b


def _row_state(world: World, name: str) -> str | None:
    row = world.scheduler.store.nodes.node_row(name)
    return None if row is None else row.state


def _until(condition: Callable[[], bool], *worlds: World, passes: int = 40) -> int:
    """Run passes of `worlds` in turn until `condition` holds: how many rounds it took."""
    for done in range(passes):
        if condition():
            return done
        for world in worlds:
            world.tick()
    raise AssertionError(f"not after {passes} rounds")


def test_the_elected_scheduler_places_on_both_nodes_and_each_starts_its_own(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    assert _agent(a).elect.election_epoch is not None
    assert _agent(b).elect.election_epoch is None  # b follows
    jobs = [a.submit(None) for _ in range(2)]  # whole GPUs: one per node
    a.tick()
    b.tick()
    assert {a.job(j).node for j in jobs} == {"a", "b"}
    assert all(a.state(j) == JobState.RUNNING for j in jobs)
    assert len(a.launcher.started) == len(b.launcher.started) == 1
    third = b.submit(None)  # submitted on the follower, placed by the scheduler
    b.tick()
    assert b.job(third).waiting_reason == "waiting for the next scheduling pass"
    a.tick()
    assert "GPU" in (b.job(third).waiting_reason or "")  # the elected one's reason, in the row


def test_a_node_not_heard_from_is_declared_down_after_node_timeout(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    lost = a.submit(GiB, allowed_nodes=("b",))
    again = a.submit(GiB, allowed_nodes=("b",), requeue=1)
    a.tick()
    b.tick()
    assert {a.state(lost), a.state(again)} == {JobState.RUNNING}
    started = a.clock.monotonic()
    rounds = _until(lambda: a.state(lost) == JobState.LOST, a)  # b is silent from now
    waited = a.clock.monotonic() - started
    margin_s = NODE_TIMEOUT_S / 3  # its lease, then the fence margin (election.fence_margin)
    assert NODE_TIMEOUT_S + margin_s <= waited <= NODE_TIMEOUT_S + margin_s + 3 * 2, (
        rounds,
        waited,
    )
    ended = a.job(lost)
    assert ended.reason == EndReason.NODE_LOST
    assert (a.state(again), a.job(again).node) == (JobState.QUEUED, None)
    assert {n.name: n.state for n in a.scheduler.nodes()}["b"] == "down"


def test_the_scheduler_declares_nobody_down_until_it_has_been_steady_for_node_timeout(
    tmp_path: Path,
) -> None:
    """After the database was away (or this daemon paused) every lease has run out: the
    other nodes get node_timeout to renew before any is declared down."""
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()
    b.tick()
    a.clock.advance(NODE_TIMEOUT_S + 10)  # nobody passed: every lease ran out
    a.tick()  # a is back, but not steady yet
    assert a.state(job) == JobState.RUNNING
    b.tick()  # b is back within node_timeout of a: nothing of b's is lost
    for _ in range(20):
        a.tick()
        b.tick()
    assert a.state(job) == JobState.RUNNING
    assert {n.name: n.state for n in a.scheduler.nodes()} == {"a": "up", "b": "up"}


def test_a_node_back_after_being_declared_down_takes_back_the_requeued_and_keeps_the_lost(
    tmp_path: Path,
) -> None:
    """A `--requeue` job queued again when its node was declared down, whose run still
    runs there when the node is heard again and that has not started elsewhere, is taken
    back: running there again (not stopped and run a second time), counted on its card,
    its one end recorded once."""
    a, b = _pair(tmp_path)
    lost = a.submit(GiB, allowed_nodes=("b",))
    again = a.submit(20 * GiB, allowed_nodes=("b",), requeue=1)
    a.tick()
    b.tick()
    first = a.job(again)
    assert (first.state, first.node) == (JobState.RUNNING, "b")
    epoch = a.scheduler.store.nodes.node_row("b").epoch  # type: ignore[union-attr]
    _until(lambda: a.state(lost) == JobState.LOST, a)
    assert (a.state(again), a.job(again).node) == (JobState.QUEUED, None)
    b.tick()  # back: its renewal is refused, it reconciles and rejoins
    assert b.launcher.stop_requests == []  # neither is stopped here
    assert lost in b.launcher.running  # ended lost with b: runs on, watched
    assert again in b.launcher.running
    row = a.scheduler.store.nodes.node_row("b")
    assert row is not None
    assert (row.state, row.epoch) == ("up", epoch + 1)  # rejoined at the epoch of its down
    taken = a.job(again)
    assert (taken.state, taken.node) == (JobState.RUNNING, "b")
    assert (
        a.scheduler.store.placements.rows_of([again])[again][2] == epoch + 1
    )  # under its new epoch
    assert (taken.gpu_uuids, taken.gpu_indices) == (first.gpu_uuids, first.gpu_indices)
    assert (taken.pid, taken.started_at, taken.log_path) == (
        first.pid,
        first.started_at,
        first.log_path,
    )
    assert a.scheduler.store.attempts.earlier_runs([again]) == {}  # its run was never ended
    # Counted on its card: a second 20G job does not fit beside it on b's 24G card.
    beside = a.submit(20 * GiB, allowed_nodes=("b",))
    for _ in range(3):
        a.tick()
        b.tick()
    assert a.state(beside) == JobState.QUEUED
    assert b.launcher.started.count(again) == 1  # never run a second time
    b.finish(lost, Outcome(OutcomeKind.EXIT, exit_code=3))  # its real end, reported by b
    ended = a.job(lost)
    assert (ended.state, ended.reason, ended.exit_code) == (JobState.FAILED, EndReason.EXIT, 3)
    b.finish(again)  # the taken-back run's end: the job's, recorded once
    done = a.job(again)
    assert (done.state, done.reason, done.exit_code) == (JobState.DONE, EndReason.EXIT, 0)
    assert (
        a.scheduler.store.attempts.earlier_runs([again]) == {}
    )  # one run, ended once: no earlier run
    _until(lambda: a.state(beside) == JobState.RUNNING, a, b)
    assert a.job(again) == done


def test_a_node_back_after_being_declared_down_stops_a_requeued_run_started_elsewhere(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    filler = a.submit(20 * GiB, allowed_nodes=("a",))
    again = a.submit(20 * GiB, requeue=1)  # a's card is taken: it goes to b
    a.tick()
    b.tick()
    assert (a.state(again), a.job(again).node) == (JobState.RUNNING, "b")
    _until(lambda: a.state(again) == JobState.QUEUED, a)  # b declared down: queued again
    a.finish(filler)
    _until(lambda: a.state(again) == JobState.RUNNING, a)  # started again, on a
    assert a.job(again).node == "a"
    b.tick()  # back: its copy runs on elsewhere, so it is stopped here
    assert b.launcher.stop_requests == [again]
    assert (a.state(again), a.job(again).node) == (JobState.RUNNING, "a")
    assert len(a.scheduler.store.attempts.earlier_runs([again])[again]) == 1


def test_a_node_declared_down_cannot_start_what_was_placed_under_its_old_epoch(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    old = b.scheduler.store.nodes.node_row("b")
    assert old is not None
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()  # placed on b; b does not pass to start it
    assert a.job(job).node == "b"
    _until(lambda: _row_state(a, "b") == "down", a)  # declared, not only expired
    assert (a.state(job), a.job(job).node) == (JobState.QUEUED, None)  # given back
    fake_gpu = b.probe.snapshot()[:1]
    # The database refuses a start under the old epoch (store.placements: node_is_live).
    assert not b.scheduler.starter.start_placed(
        a.job(job), fake_gpu, NodeGuard("b", old.epoch), (1000, 1000)
    )
    assert b.launcher.started == []


def test_a_node_fences_itself_before_it_can_be_declared_down(tmp_path: Path) -> None:
    a, _b = _pair(tmp_path)
    node = _agent(a).node
    assert not node.is_fenced()
    assert node.renewed_at is not None
    since = a.clock.monotonic() - node.renewed_at
    a.clock.advance(NODE_TIMEOUT_S * 2 / 3 - since - 0.1)
    assert not node.is_fenced()
    a.clock.advance(0.2)  # a third of node_timeout before anyone may declare it down
    assert node.is_fenced()
    a.tick()  # a renewal ends the fence
    assert not node.is_fenced()


def test_a_paused_scheduler_is_replaced_and_its_stale_placements_are_refused(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    stale_epoch = _agent(a).elect.election_epoch
    assert stale_epoch is not None
    # a pauses; b takes the election once a's lease ran out, and nothing before.
    started = b.clock.monotonic()
    _until(lambda: _agent(b).elect.election_epoch is not None, b)
    assert b.clock.monotonic() - started >= NODE_TIMEOUT_S
    job = b.submit(None)
    b.tick()
    assert b.job(job).node is not None
    # a, back, writes a placement under its old election: refused by the database.
    other = b.submit(None)
    placement = NodePlacement(other, "a", (a.probe.uuid(0),), (0,))
    assert a.scheduler.store.placements.place([placement], "a", stale_epoch) == []
    assert a.job(other).node is None
    a.tick()  # and it learns it no longer schedules
    assert _agent(a).elect.election_epoch is None
    b.tick()  # b places it on a, back in the cluster
    a.tick()
    assert (a.state(other), a.job(other).node) == (JobState.RUNNING, "a")
    # Nothing ran twice: one start per job in the whole cluster.
    started_jobs = a.launcher.started + b.launcher.started
    assert len(started_jobs) == len(set(started_jobs))


def test_a_job_goes_only_to_nodes_where_its_user_exists(tmp_path: Path) -> None:
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], missing={"a": {"bob"}})
    a.tick()
    b.tick()
    bobs = a.submit(GiB, user="bob")
    a.tick()
    b.tick()
    assert (a.state(bobs), a.job(bobs).node) == (JobState.RUNNING, "b")


def test_a_waiting_interactive_job_is_left_to_the_node_its_client_runs_on(
    tmp_path: Path, clients: Callable[[], subprocess.Popen[bytes]]
) -> None:
    """b cannot see a's processes: it must not take a's waiting client for gone."""
    a, b = make_cluster(
        tmp_path, ["a", "b"], [24 * GiB], client_alive={"b": lambda _pid, _start: False}
    )
    a.tick()
    b.tick()
    busy = a.submit(None, allowed_nodes=("a",))  # a's one GPU, whole
    a.tick()
    waiting = _interactive(a, clients())  # on a, where its client runs: it waits
    for _ in range(3):
        a.tick()
        b.tick()
    assert a.state(waiting) == JobState.QUEUED
    a.finish(busy)
    a.tick()
    assert (a.state(waiting), a.job(waiting).node) == (JobState.RUNNING, "a")
