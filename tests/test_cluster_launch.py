"""Issue 26 at the tick level: fencing at the moment of launch, the timestamps a cluster
writes, and exactly-once ends (a node's jobs reconciled from their exit records at its
restart, lost jobs still running taken back, each run of a requeued job kept). Two
daemons' schedulers on one SQLite file and one fixed clock (tests/world.py
`make_cluster`); a slow commit is made by moving the clock inside the claim's
transaction (a SQLAlchemy event on the node's own engine), nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event

from gpusched.cli.show_view import attempt_text
from gpusched.core.models import EndReason, JobState
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.cluster.agent import ClusterAgent
from gpusched.scheduling.cluster.elected import REFRESH_PER_PASS
from tests.fakes import GiB
from tests.world import World, make_cluster, make_node

ALICE = Caller(pid=101, uid=1000, gid=1000, user="alice", admin=False)
NODE_TIMEOUT_S = 30.0  # the default; the fence margin is then 10 s (a third of it)
MARGIN_S = 10.0


def _agent(world: World) -> ClusterAgent:
    placer = world.scheduler.placer
    assert isinstance(placer, ClusterAgent)
    return placer


def _pair(tmp_path: Path, **config: Any) -> tuple[World, World]:
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], **config)
    a.tick()  # a is elected
    b.tick()
    return a, b


def _slow_claim(world: World, seconds: float) -> Callable[[], None]:
    """Make this node's next claim of a placed job answer `seconds` late (the clock
    moves on once the claim's UPDATE ran, before its commit returns): how a claim that
    waited on a partition comes back. Returns how to stop it."""
    engine = world.scheduler.store.database.engine
    armed = [True]

    def late(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if armed[0] and statement.startswith("UPDATE jobs") and "started_at" in statement:
            armed[0] = False
            world.clock.advance(seconds)

    event.listen(engine, "after_cursor_execute", late)
    return lambda: event.remove(engine, "after_cursor_execute", late)


def test_a_claim_that_commits_past_the_launch_deadline_launches_nothing(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()  # placed on b
    assert a.job(job).node == "b"
    node = _agent(b).node
    stop = _slow_claim(b, NODE_TIMEOUT_S)  # the claim's answer arrives after the lease
    b.scheduler.tick()
    stop()
    assert node.launch_deadline is not None
    assert b.clock.monotonic() > node.launch_deadline
    assert b.launcher.started == []  # never launched past the deadline
    assert (a.state(job), a.job(job).node) == (JobState.QUEUED, None)  # back to the scheduler
    # Once b renews again (its deadline moves on), the job starts normally.
    for _ in range(3):
        a.tick()
        b.tick()
    assert a.state(job) == JobState.RUNNING


def test_each_launch_carries_the_node_s_deadline_to_the_supervisor(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()
    b.scheduler.tick()
    node = _agent(b).node
    assert b.launcher.started == [job]
    deadline = b.launcher.exec_by[job]
    assert deadline == node.launch_deadline
    # counted from the renewal's sending, a margin short of the lease
    assert deadline == node.renewed_at + NODE_TIMEOUT_S - MARGIN_S  # type: ignore[operator]


def test_the_deadline_counts_from_when_the_renewal_was_sent_not_when_it_returned(
    tmp_path: Path,
) -> None:
    _a, b = _pair(tmp_path)
    node = _agent(b).node
    engine = b.scheduler.store.database.engine
    sent = b.clock.monotonic()

    def slow_renewal(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("UPDATE nodes"):
            b.clock.advance(5)

    event.listen(engine, "after_cursor_execute", slow_renewal)
    b.scheduler.tick()
    event.remove(engine, "after_cursor_execute", slow_renewal)
    assert node.launch_deadline == sent + NODE_TIMEOUT_S - MARGIN_S


def test_started_at_is_the_launch_by_the_database_s_clock(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()
    claimed_at = b.clock()
    stop = _slow_claim(b, 3)  # still well inside the deadline
    b.scheduler.tick()
    stop()
    assert b.launcher.started == [job]
    started = a.job(job).started_at
    assert started is not None
    # the launch (3 s after the claim), by the database's clock, not the claim's time
    assert (datetime.fromisoformat(started) - claimed_at).total_seconds() == 3


def test_every_timestamp_in_a_cluster_is_on_the_database_s_clock(tmp_path: Path) -> None:
    """b's own clock is 2 h ahead: what b writes (submitted, started, ended) still reads
    on the database's clock, as a's does."""
    a, b = make_cluster(tmp_path, ["a", "b"], [24 * GiB], skews={"b": 7200.0})
    a.tick()
    b.tick()  # b learns its offset from its renewal
    job = b.submit(GiB, allowed_nodes=("b",))
    submitted = a.clock()  # the database's clock (the fixed clock: its leases' too)
    a.tick()
    b.scheduler.tick()
    started = a.clock()
    b.clock.advance(5)
    b.finish(job)
    ended = a.job(job)
    assert ended.state == JobState.DONE
    stamps = (ended.submitted_at, ended.started_at, ended.ended_at)
    assert [datetime.fromisoformat(t or "") for t in stamps] == [
        submitted,
        started,
        started + timedelta(seconds=5),
    ]


def test_a_node_is_declared_down_only_once_its_lease_plus_the_margin_has_passed(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    a.tick()
    b.tick()
    assert a.state(job) == JobState.RUNNING
    heard = b.clock.monotonic()  # b's last renewal; silent from now
    while a.state(job) == JobState.RUNNING:
        a.tick()
        assert b.clock.monotonic() - heard < NODE_TIMEOUT_S + MARGIN_S + 3 * 2
    waited = b.clock.monotonic() - heard
    assert waited > NODE_TIMEOUT_S + MARGIN_S, waited
    assert a.state(job) == JobState.LOST


# -- exactly-once ends ----------------------------------------------------------------------


def _declared_down_while_away(a: World, b: World, job: int, state: JobState) -> None:
    """b runs `job`, then is silent (its daemon dead, its supervisors alive) until a
    declares it down."""
    a.tick()
    b.tick()
    assert a.state(job) == JobState.RUNNING
    b.launcher.on_exit = lambda _job_id: None  # no daemon left to hear an exit
    _until(lambda: a.state(job) == state, a)


def _restart(tmp_path: Path, old: World) -> World:
    """b's daemon starts again: its supervisors and exit records are still there."""
    world = make_node(tmp_path, "b", [24 * GiB], old.clock, pid=5000, launcher=old.launcher)
    world.scheduler.adopt_running()
    world.scheduler.placer.reconcile_at_start(lambda: sorted(old.launcher.started))
    return world


def _until(condition: Callable[[], bool], *worlds: World, passes: int = 40) -> None:
    for _ in range(passes):
        if condition():
            return
        for world in worlds:
            world.tick()
    raise AssertionError(f"not after {passes} rounds")


def test_a_job_that_ended_while_its_node_was_declared_down_gets_its_real_end_at_restart(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    _declared_down_while_away(a, b, job, JobState.LOST)
    b.finish(job, Outcome(OutcomeKind.EXIT, exit_code=0))  # its supervisor's exit record
    _restart(tmp_path, b)
    ended = a.job(job)
    assert (ended.state, ended.reason, ended.exit_code) == (JobState.DONE, EndReason.EXIT, 0)


def test_a_restarted_node_stops_its_copy_of_a_requeued_job_that_ended_elsewhere(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    blocker = a.submit(None, allowed_nodes=("a",))  # a's GPU, whole: the job goes to b
    a.tick()
    job = a.submit(GiB, requeue=1)
    _declared_down_while_away(a, b, job, JobState.QUEUED)
    a.finish(blocker)
    _until(lambda: a.state(job) == JobState.RUNNING, a)
    assert a.job(job).node == "a"  # queued again, run on a
    a.finish(job)
    assert a.state(job) == JobState.DONE
    assert job in b.launcher.running  # b's old copy still runs
    _restart(tmp_path, b)
    assert b.launcher.stop_requests == [job]


def test_a_restarted_node_takes_back_a_requeued_run_still_going_that_did_not_start_elsewhere(
    tmp_path: Path,
) -> None:
    """The daemon stopped past node_timeout (its memory gone), its `--requeue` job queued
    again and still running under its supervisor: at its start it takes the run back
    (the cards it holds are kept on the run's attempt), rather than stopping it."""
    a, b = _pair(tmp_path)
    job = a.submit(20 * GiB, allowed_nodes=("b",), requeue=1)
    a.tick()
    b.tick()
    first = a.job(job)
    _declared_down_while_away(a, b, job, JobState.QUEUED)
    b = _restart(tmp_path, b)
    assert b.launcher.stop_requests == []
    taken = a.job(job)
    assert (taken.state, taken.node) == (JobState.RUNNING, "b")
    assert (taken.gpu_uuids, taken.started_at, taken.pid) == (
        first.gpu_uuids,
        first.started_at,
        first.pid,
    )
    assert a.scheduler.store.attempts.earlier_runs([job]) == {}
    other = a.submit(20 * GiB, allowed_nodes=("b",))  # counted on b's 24G card
    for _ in range(3):
        a.tick()
        b.tick()
    assert a.state(other) == JobState.QUEUED
    b.finish(job)
    assert (a.state(job), a.job(job).exit_code) == (JobState.DONE, 0)
    assert b.launcher.started.count(job) == 1


def test_a_lost_job_still_running_is_running_again_counted_and_cancellable(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    job = a.submit(20 * GiB, allowed_nodes=("b",))
    _declared_down_while_away(a, b, job, JobState.LOST)
    b = _restart(tmp_path, b)
    assert a.state(job) == JobState.RUNNING  # heard again: running, not lost
    b.tick()
    a.tick()
    # counted on its card: another 20G job does not fit on b's 24G GPU beside it
    other = a.submit(20 * GiB, allowed_nodes=("b",))
    a.tick()
    b.tick()
    assert a.state(other) == JobState.QUEUED
    a.scheduler.cancel(a.job(job), by="alice")  # from the other node
    b.scheduler.placer.poll()
    assert b.launcher.stop_requests == [job]
    b.finish(job, Outcome(OutcomeKind.CANCELLED))
    assert a.state(job) == JobState.CANCELLED


def test_a_requeued_job_whose_first_run_completed_meanwhile_is_not_run_again(
    tmp_path: Path,
) -> None:
    a, b = _pair(tmp_path)
    blocker = a.submit(None, allowed_nodes=("a",))  # a's GPU, whole: nowhere to rerun it
    a.tick()
    job = a.submit(GiB, requeue=1)
    _declared_down_while_away(a, b, job, JobState.QUEUED)
    (attempt,) = a.scheduler.store.attempts.earlier_runs([job])[job]
    assert (attempt["attempt"], attempt["node"]) == (1, "b")
    assert attempt["outcome"].startswith("queued again: node b was not heard from")
    b.finish(job, Outcome(OutcomeKind.EXIT, exit_code=0))  # its first run completes
    _restart(tmp_path, b)
    ended = a.job(job)
    assert (ended.state, ended.exit_code, ended.node) == (JobState.DONE, 0, "b")
    (attempt,) = a.scheduler.store.attempts.earlier_runs([job])[job]
    assert attempt["outcome"].endswith("; then exited 0")
    a.finish(blocker)
    for _ in range(3):
        a.tick()
    assert a.launcher.started == [blocker]  # never run a second time
    # Each run is visible: `show` and `history` (and the dashboard, which shows `show`).
    services = Services(a.scheduler, a.scheduler.store, a.scheduler.context.settings, 0)
    shown = dispatch(services, ALICE, {"op": "show", "id": job})
    assert [r["node"] for r in shown["attempts"]] == ["b"]
    listed = dispatch(services, ALICE, {"op": "history", "limit": 10})
    assert next(j for j in listed if j["id"] == job)["attempts"] == shown["attempts"]
    line = attempt_text(shown["attempts"][0])
    assert line.startswith("node b, 2026-01-05 09:00:")
    assert "queued again: node b was not heard from" in line and line.endswith("then exited 0")


def test_a_requeued_job_already_run_again_keeps_both_runs(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    blocker = a.submit(None, allowed_nodes=("a",))
    a.tick()
    job = a.submit(GiB, requeue=1)
    _declared_down_while_away(a, b, job, JobState.QUEUED)
    a.finish(blocker)
    _until(lambda: a.state(job) == JobState.RUNNING, a)  # its second run, on a
    b.finish(job, Outcome(OutcomeKind.EXIT, exit_code=0))
    _restart(tmp_path, b)
    assert (a.state(job), a.job(job).node) == (JobState.RUNNING, "a")  # its second run goes on
    (first,) = a.scheduler.store.attempts.earlier_runs([job])[job]
    assert first["node"] == "b"
    assert first["outcome"].endswith("; then exited 0")


# -- scale: waiting reasons ----------------------------------------------------------------


def test_a_draining_queue_does_not_rewrite_every_waiting_reason_each_pass(
    tmp_path: Path,
) -> None:
    # Packing by memory: 24 new jobs a round on a's card (the contention rule would start
    # jobs of unknown demand a few a pass: issue 25), the head moving on each round.
    a, b = _pair(tmp_path, pack="memory")
    blocker = a.submit(None, allowed_nodes=("b",))  # b's card, whole, for the whole test
    waiting = [a.submit(GiB, allowed_nodes=("a",)) for _ in range(600)]
    written: list[int] = []

    def count(_conn: Any, _cursor: Any, statement: str, params: Any, *_args: Any) -> None:
        if statement.startswith("UPDATE jobs SET waiting_reason"):
            written[-1] += len(params) if isinstance(params, list) else 1

    event.listen(a.scheduler.store.database.engine, "after_cursor_execute", count)
    for _ in range(6):  # each round frees a's card: the head moves on, every reason with it
        written.append(0)
        for job_id in list(a.launcher.running):
            a.finish(job_id)
        a.tick()
        b.tick()
    event.remove(a.scheduler.store.database.engine, "after_cursor_execute", count)
    assert written[0] >= len(waiting) - 24  # the first pass says why each job waits
    started_per_round = 24  # 1G jobs on a 24G card
    for rows in written[2:]:  # then only what changed in kind, and a bounded refresh
        assert rows <= REFRESH_PER_PASS + started_per_round + 2, written
    # The rows are right in kind, and the elected daemon says the exact reason.
    queued = [j for j in waiting if a.state(j) == JobState.QUEUED]
    stored = a.scheduler.store.jobs.get(queued[-1]).waiting_reason or ""
    assert "kept for job" in stored and "ahead of it" in stored
    assert a.state(blocker) == JobState.RUNNING


def test_reasons_that_name_the_busy_jobs_on_a_card_are_not_all_rewritten_each_pass(
    tmp_path: Path,
) -> None:
    """By contention (issue 25) jobs of unknown demand start a few a pass, and every
    waiting job's reason names the busy jobs on the cards ("runs busy jobs 2, 4"), which
    move on each round: a change in the jobs named is refreshed a bounded number of rows
    a pass, as the head's id is (benchmarks/cluster_drain.py: 9,984 rows a pass)."""
    a, b = _pair(tmp_path, pack="contention")
    waiting = [a.submit(GiB) for _ in range(600)]
    written: list[int] = []

    def count(_conn: Any, _cursor: Any, statement: str, params: Any, *_args: Any) -> None:
        if statement.startswith("UPDATE jobs SET waiting_reason"):
            written[-1] += len(params) if isinstance(params, list) else 1

    event.listen(a.scheduler.store.database.engine, "after_cursor_execute", count)
    for _ in range(6):
        written.append(0)
        for world in (a, b):
            for job_id in list(world.launcher.running):
                world.finish(job_id)
        a.tick()
        b.tick()
    event.remove(a.scheduler.store.database.engine, "after_cursor_execute", count)
    assert written[0] >= len(waiting) - 24
    for rows in written[2:]:
        assert rows <= REFRESH_PER_PASS + 24 + 2, written
    queued = [j for j in waiting if a.state(j) == JobState.QUEUED]
    stored = a.scheduler.store.jobs.get(queued[-1]).waiting_reason or ""
    assert "quieter card" in stored and "busy job" in stored
