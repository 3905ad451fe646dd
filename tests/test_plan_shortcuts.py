"""The shortcuts that keep one pass over a long queue cheap (issue 30: one tick with 10,000
queued) give exactly the answers of the plain rules they stand for, on random inputs:

- rule 3c's `contention_wait` asked of the room's calm cards listed once (`CalmRoom`);
- a user's queue sorted by two C sorts (`turns._sort_own`) and gathered per user
  (`in_turns`), against the one sort by `own_order` and the plain loop;
- rule 2's waiting sizes sorted only when first asked (`Needs`), placements removed before;
- the pass rules' whole-queue views (`WaitingJobs.views`) against one look-up per job;
- and whole plans, with and without the shortcuts (`test_plans_are_those_of_the_plain_rules`).

The speed itself is benchmarks/scheduling_pass.py's (never timed here)."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.scheduling.policy import UserCap, WaitingJob, plan
from gpusched.scheduling.policy.budget import GpuSlot, PlanGpu, RunningClaim, by_room
from gpusched.scheduling.policy.contention import CalmRoom, contention_wait
from gpusched.scheduling.policy.keep_for_bigger import Needs
from gpusched.scheduling.policy.turns import in_turns, submit_place
from gpusched.scheduling.policy_inputs import WaitingJobs
from gpusched.store import Queued

G = 2**30
demands = st.none() | st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 1.0])


@st.composite
def plan_gpus(draw: st.DrawFn, index: int) -> PlanGpu:
    jobs = draw(st.lists(st.tuples(st.integers(1, 999), demands), max_size=4))
    demand = sum(1.0 if d is None else d for _, d in jobs)
    measured = sum(0.0 if d is None else d for _, d in jobs)
    busy = [j for j, d in jobs if d is None or d >= 0.5]
    total = 80 * G
    return PlanGpu(
        GpuSlot(f"GPU-{index}", index, total, total),
        available=draw(st.integers(0, 80)) * G,
        potential=total,
        job_count=len(jobs),
        whole=False,
        job_ids=[j for j, _ in jobs],
        load=0.0,
        demand=demand,
        busy_with=busy,
        measured=measured,
    )


@st.composite
def rooms(draw: st.DrawFn) -> tuple[list[PlanGpu], list[PlanGpu]]:
    """The plan's room (sorted most available first) and a few cards outside it."""
    cards = [draw(plan_gpus(i)) for i in range(draw(st.integers(0, 10)))]
    outside = [draw(plan_gpus(100 + i)) for i in range(draw(st.integers(0, 2)))]
    return sorted(cards, key=by_room), outside


asks = st.builds(
    WaitingJob,
    job_id=st.integers(1, 10_000),
    mem_bytes=st.integers(1, 80).map(G.__mul__),
    gpu_count=st.integers(1, 3),
    demand=demands,
    share=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(rooms(), st.lists(asks, min_size=1, max_size=8))
def test_calm_room_answers_as_contention_wait(
    room_and_outside: tuple[list[PlanGpu], list[PlanGpu]], jobs: list[WaitingJob]
) -> None:
    room, outside = room_and_outside
    calm = CalmRoom()  # one per state of the room: several jobs ask it in turn
    for job in jobs:
        assert job.mem_bytes is not None
        prefix = bisect.bisect_right(room, -job.mem_bytes, key=lambda g: -g.available)
        found = room[:prefix] + [g for g in outside if g.available >= job.mem_bytes]
        assert calm.wait(job, found, room, prefix) == contention_wait(job, found)


waiting_jobs = st.builds(
    WaitingJob,
    job_id=st.integers(1, 50),  # repeats: ties in the order keep the order given
    mem_bytes=st.none() | st.integers(1, 8).map(G.__mul__),
    priority=st.integers(-2, 2),
    user=st.sampled_from(["alice", "bob", "carol"]),
    queue_order=st.none() | st.integers(1, 50),
    top=st.none() | st.integers(0, 3),
)


def own_order(job: WaitingJob) -> tuple[int, int]:
    """A user's own order, plainly: higher priority first, then submit order."""
    return (-job.priority, submit_place(job))


def plain_turns(
    waiting: Sequence[WaitingJob],
) -> tuple[list[WaitingJob], dict[str, list[WaitingJob]]]:
    """`in_turns` as it was written before the shortcuts: the oracle."""
    topped = sorted(
        (j for j in waiting if j.top is not None),
        key=lambda j: (j.top, j.job_id if j.queue_order is None else j.queue_order),
    )
    queues: dict[str, list[WaitingJob]] = {}
    for job in waiting:
        if job.top is None:
            queues.setdefault(job.user, []).append(job)
    for queue in queues.values():
        queue.sort(key=own_order, reverse=True)
    return topped, queues


@settings(max_examples=400, deadline=None)
@given(st.lists(waiting_jobs, max_size=30), st.booleans())
def test_each_users_queue_is_in_the_plain_order(waiting: list[WaitingJob], no_top: bool) -> None:
    if no_top:  # the C loops' own path: nobody put first
        waiting = [WaitingJob(j.job_id, j.mem_bytes, 1, j.priority, j.user) for j in waiting]
    topped, queues = in_turns(waiting, {})
    want_topped, want_queues = plain_turns(waiting)
    assert [id(j) for j in topped] == [id(j) for j in want_topped]
    assert queues.keys() == want_queues.keys()
    for user, queue in want_queues.items():
        assert [id(j) for j in queues[user]] == [id(j) for j in queue]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.none() | st.integers(1, 6), max_size=20),
    st.lists(st.integers(1, 7), max_size=6),
    st.integers(0, 6),
    st.integers(0, 7),
)
def test_waiting_sizes_sorted_late_are_the_same(
    sizes: list[int | None], placed: list[int], asked_after: int, probe: int
) -> None:
    """Sizes removed before the first question count as removed after it."""
    waiting = [WaitingJob(i, None if s is None else s * G) for i, s in enumerate(sizes)]
    cards = [PlanGpu(GpuSlot("GPU-0", 0, 8 * G, 8 * G), 0, 4 * G, 0, False, [], 0.0)]
    late, eager = Needs(waiting, cards), Needs(waiting, cards)
    eager.count  # noqa: B018 -- sorted now, before any placement
    for n, mem in enumerate(placed):
        if n == asked_after:
            late.count  # noqa: B018
        late.remove(mem * G)
        eager.remove(mem * G)
    assert late.count == eager.count
    assert late.larger(probe * G) == eager.larger(probe * G)
    assert late.served(late.larger(probe * G), cards[0]) == eager.served(
        eager.larger(probe * G), cards[0]
    )


def queued(job_id: int, priority: int = 0) -> Queued:
    return Queued(job_id, "alice", G, 1, priority, [], None, None, None, None)


def test_whole_queue_views_are_the_per_job_views() -> None:
    now = datetime(2026, 11, 26, tzinfo=timezone.utc)
    jobs = [queued(i) for i in range(1, 6)]
    views = WaitingJobs()
    first = views.views(jobs, now)
    assert list(first) == [views.anywhere(j, now)[0] for j in jobs]
    views.new_pass()
    again = views.views(list(jobs), now)  # the same Queued objects: last pass's views
    assert all(a is b for a, b in zip(first, again, strict=True))
    changed = [*jobs[:2], queued(3, priority=4), *jobs[3:]]  # a changed row: a new Queued
    views.new_pass()
    third = views.views(changed, now)
    assert third[2].priority == 4 and third[2] is not first[2]
    assert third[0] is first[0] and third[4] is first[4]
    views.new_pass()
    assert views.views(jobs[1:], now) == first[1:]  # one job left the queue
    # The store's very tuple again (an unchanged queue): the very tuple of views again,
    # which what a pass derives from them is kept by (scheduling.last_answer).
    stored = tuple(jobs)
    kept = views.views(stored, now)
    assert views.views(stored, now) is kept and list(kept) == list(first)


@st.composite
def contention_snapshots(
    draw: st.DrawFn,
) -> tuple[list[GpuSlot], list[RunningClaim], list[WaitingJob]]:
    n = draw(st.integers(1, 6))
    gpus = [GpuSlot(f"GPU-{i}", i, 40 * G, 40 * G) for i in range(n)]
    running: list[RunningClaim] = []
    free = [40 * G] * n
    for job_id in range(1, 1 + draw(st.integers(0, 8))):
        i = draw(st.integers(0, n - 1))
        mem = draw(st.integers(1, 8)) * G
        if mem > free[i]:
            continue
        free[i] -= mem
        demand = draw(demands)
        running.append(RunningClaim(job_id, (f"GPU-{i}",), mem, {f"GPU-{i}": mem}, demand=demand))
    gpus = [GpuSlot(g.uuid, g.index, g.total_bytes, free[g.index]) for g in gpus]
    waiting = [
        WaitingJob(
            100 + k,
            draw(st.integers(1, 12)) * G,
            draw(st.integers(1, 2)),
            demand=draw(demands),
            share=draw(st.booleans()),
            user=draw(st.sampled_from(["alice", "bob"])),
        )
        for k in range(draw(st.integers(0, 25)))
    ]
    return gpus, running, waiting


def _every_card_allowed(gpus: list[GpuSlot], job: WaitingJob) -> WaitingJob:
    """A job allowed every card (`gpu_keys`: all of them) asks the same as one allowed
    any, but goes the plain way: each card tested, `contention_wait` over them all, where
    the other takes the room's prefix and `CalmRoom`."""
    return dataclasses.replace(job, gpu_keys=frozenset(g.uuid for g in gpus))


def _a_cap_that_never_binds(_gpus: list[GpuSlot], job: WaitingJob) -> WaitingJob:
    """A job with an array cap that never binds (no array id) goes through `consider`
    every time, where the last user's tail takes an ask's reason inline (`plan`'s loop)."""
    return dataclasses.replace(job, array_cap=10**9)


@pytest.mark.parametrize("plainer", [_every_card_allowed, _a_cap_that_never_binds])
@settings(max_examples=300, deadline=None)
@given(
    contention_snapshots(),
    st.sampled_from(["most-free", "best-fit"]),
    st.none() | st.integers(1, 3),
)
def test_plans_are_those_of_the_plain_rules(
    plainer: Callable[[list[GpuSlot], WaitingJob], WaitingJob],
    snapshot: tuple[list[GpuSlot], list[RunningClaim], list[WaitingJob]],
    placement: str,
    max_jobs: int | None,
) -> None:
    """With and without the shortcuts, on whole plans (`plainer` asks the same of each
    job so that no shortcut applies): the same placements, reasons and held jobs, under
    either `pack`."""
    gpus, running, waiting = snapshot
    plain = [plainer(gpus, job) for job in waiting]
    for pack in ("contention", "memory"):
        fast = plan(gpus, running, waiting, 0, max_jobs, placement=placement, pack=pack)
        slow = plan(gpus, running, plain, 0, max_jobs, placement=placement, pack=pack)
        assert fast.placements == slow.placements
        assert fast.waiting_reasons == slow.waiting_reasons
        assert fast.quieter == slow.quieter
        assert fast.head_claim == slow.head_claim


def test_a_cap_still_speaks_first_in_the_queue_s_tail() -> None:
    """The tail's inline reason is that of an ask that found too few cards; a job held back
    by its array's or its owner's cap is told that instead, as `consider` says first."""
    full = GpuSlot("GPU-0", 0, 80 * G, 80 * G)  # held whole by job 1, nothing used yet
    running = [
        RunningClaim(1, ("GPU-0",), None, user="bob", array_id=5),
        RunningClaim(2, ("GPU-0",), 4 * G, user="bob"),
    ]
    waiting = [
        WaitingJob(10, 8 * G, user="alice"),  # the head: it keeps the card
        WaitingJob(11, 8 * G, user="alice"),  # the same ask: too few cards, said once
        WaitingJob(12, 8 * G, user="bob", array_id=5, array_cap=1),
        WaitingJob(13, 8 * G, user="bob"),
    ]
    caps = {"bob": UserCap(max_running=2)}
    usage = {"alice": 0.0, "bob": 1.0}  # alice's turn first: bob is the last user
    for pack in ("contention", "memory"):
        result = plan([full], running, waiting, user_caps=caps, user_usage=usage, pack=pack)
        assert result.placements == []
        assert result.waiting_reasons[12].startswith("array limit: 1 of array a5 running")
        assert result.waiting_reasons[13].startswith("user limit: bob has 2 running")


def test_turns_asked_again_of_the_same_views_are_fresh_and_the_same() -> None:
    """`in_turns` keeps its last answer for the very same views (a pass over a queue that
    did not change): the answer is the same, its lists are new each time (the plan takes
    them apart), and other views, even equal ones, are answered anew."""
    jobs = [WaitingJob(i, G, user=u, priority=i % 3) for i, u in enumerate("abcabcab", 1)]
    topped, queues = in_turns(jobs, {})
    queues["a"].pop()
    again_topped, again = in_turns(list(jobs), {})
    assert again_topped == topped == []
    assert [j.job_id for j in again["a"]] == [7, 4, 1]  # whole again: not the one taken apart
    assert all(x is y for x, y in zip(again["a"], [jobs[6], jobs[3], jobs[0]], strict=True))
    moved = [*jobs[:7], dataclasses.replace(jobs[7], priority=9)]  # one view changed
    assert [j.job_id for j in in_turns(moved, {})[1]["b"]][-1] == 8  # it now goes first
    equal = [dataclasses.replace(j) for j in jobs]  # equal, not the same: answered anew
    answer = in_turns(equal, {})[1]["c"]
    assert all(x is y for x, y in zip(answer, [equal[5], equal[2]], strict=True))
