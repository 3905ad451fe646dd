"""Fair share in the pure policy: decayed usage, ordering between users, no starvation."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.scheduling.policy import (
    GpuSlot,
    RunningClaim,
    UsageSpan,
    WaitingJob,
    decayed_usage,
    plan,
)

GiB = 2**30
HOUR = 3600.0


def test_decayed_usage_matches_the_closed_form() -> None:
    # 10 GiB held for one hour, ending now, half-life one hour.
    usage = decayed_usage([UsageSpan("a", 10 * GiB, 0.0, HOUR)], now_s=HOUR, half_life_s=HOUR)
    expected = 10 * GiB * HOUR / math.log(2) * (1 - 0.5)
    assert math.isclose(usage["a"], expected, rel_tol=1e-9)
    # A short span ending now weighs about bytes x seconds.
    short = decayed_usage([UsageSpan("a", GiB, 0.0, 1.0)], now_s=1.0, half_life_s=HOUR)
    assert math.isclose(short["a"], GiB * 1.0, rel_tol=1e-3)


def test_usage_halves_every_half_life_and_running_jobs_count_until_now() -> None:
    recent = decayed_usage([UsageSpan("a", GiB, 0.0, 60.0)], now_s=60.0, half_life_s=HOUR)
    older = decayed_usage([UsageSpan("a", GiB, 0.0, 60.0)], now_s=60.0 + HOUR, half_life_s=HOUR)
    assert math.isclose(older["a"], recent["a"] / 2, rel_tol=1e-9)
    running = decayed_usage([UsageSpan("b", GiB, 0.0, None)], now_s=60.0, half_life_s=HOUR)
    assert math.isclose(running["b"], recent["a"], rel_tol=1e-9)


def _one_slot() -> list[GpuSlot]:
    return [GpuSlot("g0", 0, 24 * GiB, 24 * GiB)]


job_lists = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-3, 3)), min_size=1, max_size=12
)


@given(job_lists)
def test_with_equal_use_the_earlier_submit_decides_and_priority_stays_within_a_user(
    jobs: list[tuple[str, int]],
) -> None:
    # Issue 24 item 14: a --priority orders its user's own jobs only; between users with
    # equal use, the user whose best job was submitted first goes first (it used to be the
    # highest priority of all users, so a user could jump others by raising theirs).
    waiting = [WaitingJob(i + 1, 20 * GiB, 1, prio, user) for i, (user, prio) in enumerate(jobs)]
    usage = {"a": 5.0, "b": 5.0, "c": 5.0}
    placed = plan(_one_slot(), [], waiting, user_usage=usage).placements
    best_of: dict[str, WaitingJob] = {}
    for job in sorted(waiting, key=lambda j: (-j.priority, j.job_id)):
        best_of.setdefault(job.user, job)
    best = min(best_of.values(), key=lambda j: j.job_id)
    assert [p.job_id for p in placed] == [best.job_id]


def test_a_higher_priority_does_not_pass_another_users_earlier_job() -> None:
    waiting = [WaitingJob(1, 20 * GiB, 1, 0, "a"), WaitingJob(2, 20 * GiB, 1, 9, "b")]
    placed = plan(_one_slot(), [], waiting).placements
    assert [p.job_id for p in placed] == [1]


def test_an_administrators_top_goes_before_every_user() -> None:
    waiting = [WaitingJob(1, 20 * GiB, 1, 0, "a"), WaitingJob(2, 20 * GiB, 1, 0, "b", top=1)]
    placed = plan(_one_slot(), [], waiting, user_usage={"a": 0.0, "b": 1e15}).placements
    assert [p.job_id for p in placed] == [2]


def test_a_user_with_no_recent_use_does_not_take_every_slot_in_one_pass() -> None:
    # Issue 24 item 14: 12 slots, a user with no use submits 30 jobs, a user with a little
    # use one: users take turns within the pass, so the light user's job starts now.
    gpus = [GpuSlot(f"g{i}", i, 24 * GiB, 24 * GiB) for i in range(6)]
    flood = [WaitingJob(i, 10 * GiB, 1, 0, "new") for i in range(1, 31)]
    light = WaitingJob(31, 10 * GiB, 1, 0, "light")
    result = plan(gpus, [], [*flood, light], user_usage={"new": 0.0, "light": 1e9})
    placed = [p.job_id for p in result.placements]
    assert len(placed) == 12
    assert 31 in placed


@given(job_lists, st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e15), min_size=3))
def test_the_user_who_used_least_goes_first_whatever_the_priority(
    jobs: list[tuple[str, int]], usage: dict[str, float]
) -> None:
    waiting = [WaitingJob(i + 1, 20 * GiB, 1, prio, user) for i, (user, prio) in enumerate(jobs)]
    placed = plan(_one_slot(), [], waiting, user_usage=usage).placements
    winner = next(j for j in waiting if j.job_id == placed[0].job_id)
    least = min(usage[j.user] for j in waiting)
    assert usage[winner.user] == least
    mine = [j for j in waiting if j.user == winner.user]
    assert winner == min(mine, key=lambda j: (-j.priority, j.job_id))


@settings(max_examples=60, deadline=None)
@given(
    flood=st.integers(5, 30),
    light=st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True),
    duration=st.integers(1, 4),
)
def test_no_user_starves(flood: int, light: list[int], duration: int) -> None:
    """One GPU that fits one job; user a floods the queue at t=0, user b submits now and then.

    Every job of both users runs in the end; and a job b submits while b is the lighter
    user with nothing else queued starts within two job lengths (it waits at most for the
    running job and one more), however many of a's jobs wait.
    """
    step_s = 60.0
    waiting: list[WaitingJob] = [WaitingJob(i + 1, 20 * GiB, 1, 0, "a") for i in range(flood)]
    submitted_at = {j.job_id: 0 for j in waiting}
    next_id = flood + 1
    spans: list[UsageSpan] = []
    running: list[tuple[WaitingJob, int]] = []  # job, end step
    started: dict[int, int] = {}
    light_arrivals = sorted(light)
    lighter_at_submit: set[int] = set()
    for step in range(flood * duration + 200):
        for _ in range(light_arrivals.count(step)):
            now_usage = decayed_usage(spans, now_s=step * step_s, half_life_s=HOUR)
            b_idle = not any(j.user == "b" for j in waiting)
            if b_idle and now_usage.get("b", 0.0) < now_usage.get("a", 0.0):
                lighter_at_submit.add(next_id)
            waiting.append(WaitingJob(next_id, 20 * GiB, 1, 0, "b"))
            submitted_at[next_id] = step
            next_id += 1
        running = [(job, end) for job, end in running if end > step]
        claims = [
            RunningClaim(j.job_id, ("g0",), j.mem_bytes, {"g0": j.mem_bytes or 0}, j.user)
            for j, _ in running
        ]
        usage = decayed_usage(spans, now_s=step * step_s, half_life_s=HOUR)
        for placement in plan(_one_slot(), claims, waiting, user_usage=usage).placements:
            job = next(j for j in waiting if j.job_id == placement.job_id)
            waiting.remove(job)
            running.append((job, step + duration))
            started[job.job_id] = step
            spans.append(
                UsageSpan(job.user, job.mem_bytes or 0, step * step_s, (step + duration) * step_s)
            )
        if not waiting and not running and step > max(light_arrivals):
            break
    assert not waiting, f"never started: {[j.job_id for j in waiting]}"
    for job_id in lighter_at_submit:
        at = submitted_at[job_id]
        assert started[job_id] - at <= 2 * duration, (job_id, at, started[job_id])


@settings(max_examples=100, deadline=None)
@given(
    jobs=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=30),
    slots=st.integers(1, 12),
    usage=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e15)),
)
def test_users_take_turns_within_a_pass(
    jobs: list[str], slots: int, usage: dict[str, float]
) -> None:
    """However much a user used before, nobody gets a second slot in a pass while another
    user's job that would fit is left waiting."""
    gpus = [GpuSlot(f"g{i}", i, 24 * GiB, 24 * GiB) for i in range(slots)]
    waiting = [WaitingJob(i + 1, 20 * GiB, 1, 0, user) for i, user in enumerate(jobs)]
    placed = {p.job_id for p in plan(gpus, [], waiting, user_usage=usage).placements}
    got = {user: sum(1 for j in waiting if j.user == user and j.job_id in placed) for user in jobs}
    for user, mine in got.items():
        if any(j.user == user and j.job_id not in placed for j in waiting):
            assert all(others <= mine + 1 for others in got.values())


def test_a_job_passed_by_fair_share_is_told_so() -> None:
    # Issue 24 item 14: "no reason says fair share decided". Alice submitted first but
    # used the card recently; Bob's later job takes the one slot by fair share.
    waiting = [WaitingJob(1, 20 * GiB, 1, 0, "alice"), WaitingJob(2, 20 * GiB, 1, 0, "bob")]
    result = plan(_one_slot(), [], waiting, user_usage={"alice": 1e15, "bob": 0.0})
    assert [p.job_id for p in result.placements] == [2]
    why = result.waiting_reasons[1]
    assert "fair share" in why and "bob's job 2 on GPU 0" in why


def test_turns_within_a_pass_are_named_too() -> None:
    # Equal use: Alice's first job goes first, then Bob's turn passes Alice's second job.
    slots = [GpuSlot("g0", 0, 24 * GiB, 24 * GiB), GpuSlot("g1", 1, 24 * GiB, 24 * GiB)]
    waiting = [
        WaitingJob(1, 20 * GiB, 1, 0, "alice"),
        WaitingJob(2, 20 * GiB, 1, 0, "alice"),
        WaitingJob(3, 20 * GiB, 1, 0, "bob"),
    ]
    result = plan(slots, [], waiting, user_usage={"alice": 1.0, "bob": 1.0})
    assert sorted(p.job_id for p in result.placements) == [1, 3]
    assert "fair share went first: bob's job 3" in result.waiting_reasons[2]


def test_no_fair_share_is_claimed_where_submit_order_decided() -> None:
    waiting = [WaitingJob(1, 20 * GiB, 1, 0, "bob"), WaitingJob(2, 20 * GiB, 1, 0, "alice")]
    result = plan(_one_slot(), [], waiting, user_usage={"alice": 0.0, "bob": 0.0})
    assert [p.job_id for p in result.placements] == [1]
    assert "fair share" not in result.waiting_reasons[2]
    # Nor where the job could not have fitted anyway.
    big = [WaitingJob(1, 20 * GiB, 1, 0, "alice"), WaitingJob(2, 30 * GiB, 1, 0, "alice")]
    small = WaitingJob(3, 10 * GiB, 1, 0, "bob")
    slots = [GpuSlot("g0", 0, 24 * GiB, 24 * GiB)]
    result = plan(slots, [], [*big, small], user_usage={"alice": 1e15, "bob": 0.0})
    assert "fair share" not in result.waiting_reasons[2]
