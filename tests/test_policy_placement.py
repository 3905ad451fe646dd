"""How a card is chosen (issue 24's placement rules, issue 25's contention rule), in the
pure policy: the head's claim by memory and backfill beside it, big cards kept for big
jobs, contention, topology, most-free or best-fit, and the reasons that say so."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.models import Job
from gpusched.scheduling.policy import (
    GpuSlot,
    HeadClaim,
    Plan,
    RunningClaim,
    UserCap,
    WaitingJob,
    plan,
)
from gpusched.scheduling.policy_inputs import running_claims

G = 2**30


def card(index: int, total_g: float = 24, others_g: float = 0, used_g: float = 0) -> GpuSlot:
    total = int(total_g * G)
    return GpuSlot(f"GPU-{index}", index, total, total - int((others_g + used_g) * G))


def job_on(
    job_id: int,
    index: int,
    mem_g: float,
    *,
    ends_in_s: float | None = None,
    demand: float | None = None,
    exclusive: bool = False,
) -> RunningClaim:
    uuid = f"GPU-{index}"
    return RunningClaim(
        job_id,
        (uuid,),
        int(mem_g * G),
        {uuid: int(mem_g * G)},
        ends_in_s=ends_in_s,
        demand=demand,
        exclusive=exclusive,
    )


def gpus_of(result: Plan, job_id: int) -> list[int] | None:
    for p in result.placements:
        if p.job_id == job_id:
            return [int(u.split("-")[1]) for u in p.gpu_uuids]
    return None


# -- rule 1: the head's claim by memory, on the card that frees first ------------------------


def test_the_head_claims_the_card_whose_jobs_end_first_by_their_time() -> None:
    # Issue 24 item 1: a multi-day job on GPU 0, a 3-minute one on GPU 1.
    gpus = [card(0, used_g=20), card(1, used_g=10)]
    running = [job_on(1, 0, 20, ends_in_s=3 * 86400), job_on(2, 1, 10, ends_in_s=180)]
    result = plan(gpus, running, [WaitingJob(3, 20 * G)])
    assert result.head_claim == HeadClaim(3, ("GPU-1",), 20 * G)
    assert (
        "GPU 1 kept for it: starts when job 2 ends (by --time, within 3m"
        in (result.waiting_reasons[3])
    )


def test_without_time_the_head_claims_the_card_with_least_memory_to_free() -> None:
    gpus = [card(0, used_g=20), card(1, used_g=10)]
    result = plan(gpus, [job_on(1, 0, 20), job_on(2, 1, 10)], [WaitingJob(3, 20 * G)])
    assert result.head_claim == HeadClaim(3, ("GPU-1",), 20 * G)
    assert "starts when job 2 ends" in result.waiting_reasons[3]


def test_a_stored_claim_is_kept_while_its_job_is_head() -> None:
    # A fresh choice would be GPU 1 (less to free); the stored claim on GPU 0 stays, so the
    # wait already spent on it is not thrown away.
    gpus = [card(0, used_g=20), card(1, used_g=10)]
    stored = HeadClaim(3, ("GPU-0",), 20 * G)
    result = plan(
        gpus, [job_on(1, 0, 20), job_on(2, 1, 10)], [WaitingJob(3, 20 * G)], head_claim=stored
    )
    assert result.head_claim == stored
    # ... and only while that job is head: another head chooses afresh.
    other = plan(
        gpus, [job_on(1, 0, 20), job_on(2, 1, 10)], [WaitingJob(4, 20 * G)], head_claim=stored
    )
    assert other.head_claim == HeadClaim(4, ("GPU-1",), 20 * G)


def test_a_small_job_may_share_the_kept_card_when_the_head_still_fits() -> None:
    # Issue 24 item 2: one 48G card running 40G (30G + 10G), the head needs 20G: once the
    # 30G job ends it has 38G, so a 4G job beside it costs the head nothing.
    gpus = [card(0, 48, used_g=40)]
    running = [job_on(1, 0, 30), job_on(2, 0, 10)]
    result = plan(gpus, running, [WaitingJob(3, 20 * G), WaitingJob(4, 4 * G)])
    assert gpus_of(result, 4) == [0]
    assert gpus_of(result, 3) is None
    # A job that would leave the head short once job 1 ends does not start there.
    tight = [card(0, 48, used_g=40)]
    result = plan(
        tight, [job_on(1, 0, 38), job_on(2, 0, 2)], [WaitingJob(3, 44 * G), WaitingJob(4, 4 * G)]
    )
    assert gpus_of(result, 4) is None
    assert "kept for job 3 ahead of it" in result.waiting_reasons[4]


def test_a_job_whose_time_ends_before_the_head_can_start_may_use_the_kept_card() -> None:
    # Light jobs: together they keep the card within its busy time, so neither is slowed
    # past its --time (module time_limits).
    gpus = [card(0, 48, used_g=40)]
    running = [job_on(1, 0, 40, ends_in_s=600, demand=0.3)]
    head = WaitingJob(2, 44 * G)
    short = WaitingJob(3, 8 * G, time_limit_s=300, demand=0.3)
    long = WaitingJob(4, 8 * G, time_limit_s=900, demand=0.3)
    assert gpus_of(plan(gpus, running, [head, short]), 3) == [0]
    assert gpus_of(plan(gpus, running, [head, long]), 4) is None
    assert gpus_of(plan(gpus, running, [head, WaitingJob(5, 8 * G)]), 5) is None


@settings(max_examples=150, deadline=None)
@given(
    total_g=st.integers(24, 80),
    first=st.lists(st.integers(1, 30), min_size=1, max_size=5),
    head_g=st.integers(4, 80),
    smalls=st.lists(st.integers(1, 20), max_size=8),
    order=st.randoms(use_true_random=False),
)
def test_memory_backfill_never_delays_the_head_in_any_order_of_ends(
    total_g: int, first: list[int], head_g: int, smalls: list[int], order: random.Random
) -> None:
    """One card, jobs on it ending one at a time in a random order; the head starts no
    later than it would have with no job behind it (those never end here)."""
    first = [m for m in first if m <= total_g][: max(1, len(first))]
    if sum(first) > total_g or head_g > total_g or not first:
        return
    ends = list(range(len(first)))
    order.shuffle(ends)

    def start_step(behind: Sequence[int]) -> int | None:
        running = {i + 1: m for i, m in enumerate(first)}
        waiting = [WaitingJob(100, head_g * G)] + [
            WaitingJob(200 + i, m * G) for i, m in enumerate(behind)
        ]
        claim: HeadClaim | None = None
        for step in range(len(ends) + 1):
            if step:
                running.pop(ends[step - 1] + 1, None)
            used = sum(running.values())
            result = plan(
                [card(0, total_g, used_g=used)],
                [job_on(j, 0, m) for j, m in running.items()],
                waiting,
                head_claim=claim,
            )
            claim = result.head_claim
            placed = {p.job_id for p in result.placements}
            if 100 in placed:
                return step
            sizes = {w.job_id: w.mem_bytes or 0 for w in waiting}
            for p in result.placements:
                running[p.job_id] = sizes[p.job_id] // G
            waiting = [w for w in waiting if w.job_id not in placed]
        return None

    alone = start_step([])
    with_behind = start_step(smalls)
    if alone is not None:
        assert with_behind is not None
        assert with_behind <= alone


# -- rule 2: big cards for big jobs -------------------------------------------------------


def test_small_jobs_leave_the_only_cards_a_larger_job_fits_on() -> None:
    # Issue 24 item 3: cards 24, 24, 80, 80; two 20G jobs and a 2 x 70G job together.
    gpus = [card(0, 24), card(1, 24), card(2, 80), card(3, 80)]
    waiting = [WaitingJob(1, 20 * G), WaitingJob(2, 20 * G), WaitingJob(3, 70 * G, gpu_count=2)]
    result = plan(gpus, [], waiting)
    assert sorted((gpus_of(result, 1) or []) + (gpus_of(result, 2) or [])) == [0, 1]
    assert gpus_of(result, 3) == [2, 3]


@settings(max_examples=100, deadline=None)
@given(
    small_cards=st.integers(1, 4),
    big_cards=st.integers(1, 4),
    small_jobs=st.lists(st.integers(2, 20), min_size=1, max_size=4),
    large_g=st.integers(30, 70),
    data=st.data(),
)
def test_a_larger_job_starts_when_the_small_ones_fit_elsewhere(
    small_cards: int, big_cards: int, small_jobs: list[int], large_g: int, data: st.DataObject
) -> None:
    small_jobs = small_jobs[:small_cards]  # each small job has a small card of its own
    count = data.draw(st.integers(1, big_cards))
    gpus = [card(i, 24) for i in range(small_cards)]
    gpus += [card(small_cards + i, 80) for i in range(big_cards)]
    waiting = [WaitingJob(i + 1, m * G) for i, m in enumerate(small_jobs)]
    large = WaitingJob(100, large_g * G, gpu_count=count)
    result = plan(gpus, [], [*waiting, large])
    assert gpus_of(result, 100) is not None


def test_a_busy_job_takes_the_quiet_card_kept_for_a_bigger_one_only_where_it_still_fits() -> None:
    """Rule 2 gives way to contention where it costs the larger job nothing: the 70G job
    (held back by its owner's max_running) still fits on the 80G card beside an 8G busy
    job, not beside a 12G one, which goes beside the busy job on the 24G card."""
    gpus = [card(0, 24, used_g=10), card(1, 80)]
    running = [job_on(1, 0, 10, demand=0.95)]
    bigger = WaitingJob(2, 70 * G, user="bob")
    caps = {"bob": UserCap(max_running=0)}
    for size_g, where in ((8, [1]), (12, [0])):
        busy = WaitingJob(3, size_g * G, user="alice", demand=0.95)
        result = plan(gpus, running, [bigger, busy], user_caps=caps)
        assert gpus_of(result, 3) == where, size_g
        assert gpus_of(result, 2) is None


# -- rule 3: contention ---------------------------------------------------------------------


def test_a_busy_job_goes_to_a_quiet_card_over_one_with_more_memory() -> None:
    gpus = [card(0, 80, used_g=10), card(1, 48)]
    running = [job_on(1, 0, 10, demand=0.9)]
    busy = WaitingJob(2, 10 * G, demand=0.9)
    assert gpus_of(plan(gpus, running, [busy]), 2) == [1]
    assert gpus_of(plan(gpus, running, [busy], pack="memory"), 2) == [0]  # as before


def test_a_busy_job_waits_for_a_quieter_card_and_keeps_the_one_that_frees_first() -> None:
    gpus = [card(0, 80, used_g=10), card(1, 80, used_g=10)]
    running = [job_on(1, 0, 10, demand=0.9, ends_in_s=600), job_on(2, 1, 10, demand=0.8)]
    busy = WaitingJob(3, 10 * G, demand=0.9, waited_s=720)
    light = WaitingJob(4, 5 * G, demand=0.1)
    result = plan(gpus, running, [busy, light])
    assert gpus_of(result, 3) is None
    assert result.quieter == {3}
    reason = result.waiting_reasons[3]
    assert "waits for a quieter card" in reason
    assert "GPU 0 runs busy job 1" in reason
    assert "GPU 1 runs busy job 2" in reason
    assert "for 12 min so far" in reason
    assert "GPU 0 kept for it: starts when busy job 1 ends (by --time, within 10m)" in reason
    assert result.head_claim is None  # waiting for quiet is no claim on memory
    assert gpus_of(result, 4) == [1]  # a light job behind it: not on the kept card
    # Job 1 ends: GPU 0 is quiet, the busy job starts there.
    again = plan([card(0, 80), gpus[1]], running[1:], [busy, light])
    assert gpus_of(again, 3) == [0]


def test_a_busy_job_counts_light_jobs_that_add_up_as_a_busy_card() -> None:
    # Rule 3b: GPU 0 runs three light jobs (0.3 each, 90 % together), GPU 1 a busy one.
    # Neither is quiet with a 0.5 job and both are busy already: it waits (the light jobs
    # on GPU 0 would stretch it as a busy neighbour does: FIELD.md's C+S+S+S row).
    gpus = [card(0, 80, used_g=6), card(1, 80, used_g=2)]
    running = [job_on(i, 0, 2, demand=0.3) for i in (1, 2, 3)] + [job_on(4, 1, 2, demand=0.6)]
    busy = WaitingJob(5, 4 * G, demand=0.5)
    result = plan(gpus, running, [busy])
    assert gpus_of(result, 5) is None
    assert "GPU 0 runs jobs 1, 2, 3 (90% busy)" in result.waiting_reasons[5]
    # Two light jobs (40 % together): the card is not busy yet, the busy job goes there.
    lighter = [job_on(i, 0, 2, demand=0.2) for i in (1, 2)] + running[3:]
    assert gpus_of(plan(gpus, lighter, [busy]), 5) == [0]


def test_a_job_of_unknown_demand_goes_where_it_disturbs_least() -> None:
    # Counted busy, it never waits: a card not busy yet first, else the least loaded.
    gpus = [card(0, 80, used_g=6), card(1, 80, used_g=2)]
    unknown = WaitingJob(5, 4 * G)
    lights = [job_on(i, 0, 2, demand=0.2) for i in (1, 2)]
    assert gpus_of(plan(gpus, [*lights, job_on(4, 1, 2, demand=0.6)], [unknown]), 5) == [0]
    heavy = [job_on(i, 0, 2, demand=0.3) for i in (1, 2, 3)]
    assert gpus_of(plan(gpus, [*heavy, job_on(4, 1, 2, demand=0.6)], [unknown]), 5) == [1]


def test_a_light_job_waits_when_no_card_stays_within_a_cards_busy_time() -> None:
    # Rule 3c for a light job: 0.3 beside 0.9 or 0.8 passes 100 %; a 0.1 job fits beside
    # 0.8. The held one keeps the card that frees first and starts there once it has.
    gpus = [card(0, 80, used_g=10), card(1, 80, used_g=10)]
    running = [job_on(1, 0, 10, demand=0.9), job_on(2, 1, 10, demand=0.8, ends_in_s=300)]
    light = WaitingJob(3, 4 * G, demand=0.3)
    lighter = WaitingJob(4, 4 * G, demand=0.1)
    result = plan(gpus, running, [light, lighter])
    assert gpus_of(result, 3) is None
    assert result.quieter == {3}
    reason = result.waiting_reasons[3]
    assert "no card stays within 100 % with it" in reason
    assert "GPU 1 kept for it: starts when busy job 2 ends" in reason
    assert gpus_of(result, 4) == [0]  # the kept card takes no job behind it
    assert gpus_of(plan([gpus[0], card(1, 80)], running[:1], [light]), 3) == [1]


def test_a_job_behind_one_held_for_a_quieter_card_is_told_the_card_is_kept() -> None:
    # On a real H100 (one card): a busy job runs, a second busy one is held and keeps the
    # card, a light one behind it would fit by memory. Its reason said "needs 4.0G on 1
    # GPU, most available is 74.7G on GPU 0; GPU 0 kept for job 4": the memory it was
    # said to lack was there. The kept card is not counted as available, as a card kept
    # for the head ahead of it is not.
    gpus = [card(0, 80, used_g=5)]
    running = [job_on(3, 0, 5, demand=0.98, ends_in_s=60)]
    busy = WaitingJob(4, 4 * G, demand=0.98)
    light = WaitingJob(5, 4 * G, demand=0.04)
    result = plan(gpus, running, [busy, light])
    assert gpus_of(result, 4) is None and gpus_of(result, 5) is None
    assert result.waiting_reasons[5] == (
        "needs 4.0G on 1 GPU; GPU 0 kept for job 4 (held for a quieter card)"
    )


def test_an_unknown_or_shared_job_starts_where_a_light_job_would() -> None:
    # Issue 25: a job with no history never waits because its demand is unknown.
    gpus = [card(0, 80, used_g=10), card(1, 80, used_g=10)]
    running = [job_on(1, 0, 10, demand=0.9), job_on(2, 1, 10, demand=0.8)]
    for job in (
        WaitingJob(3, 10 * G),  # no known demand
        WaitingJob(3, 10 * G, share=True),  # its owner says it is light, nothing else
        WaitingJob(3, 10 * G, demand=0.1),  # light, and quiet beside job 2
    ):
        assert gpus_of(plan(gpus, running, [job]), 3) is not None
    # What was measured of its kind outranks what its owner says of it.
    measured = WaitingJob(3, 10 * G, demand=0.9, share=True)
    result = plan(gpus, running, [measured])
    assert gpus_of(result, 3) is None and result.quieter == {3}
    assert "measured in its earlier runs (--share or interactive" in result.waiting_reasons[3]


def test_a_job_expected_from_its_owners_runs_is_held_as_known_and_told_so() -> None:
    # The owner prior (pass_rules.expected_demand): a job with no history of its own whose
    # owner's latest 5 ended runs were all busy counts as busy, so with a busy job on
    # every card it waits for a quieter one (one with nothing known starts, as before),
    # and its reason says where the figure comes from and how to override it.
    gpus = [card(0, 80, used_g=10), card(1, 80, used_g=10)]
    running = [job_on(1, 0, 10, demand=0.9, ends_in_s=600), job_on(2, 1, 10, demand=0.8)]
    expected_busy = WaitingJob(3, 10 * G, demand=0.92, owner_runs=5)
    result = plan(gpus, running, [expected_busy])
    assert gpus_of(result, 3) is None and result.quieter == {3}
    reason = result.waiting_reasons[3]
    assert reason.startswith(
        "waits for a quieter card (expected busy: its owner's last 5 jobs were, and it has no runs"
        " of its own yet (--share if it is not): it keeps a card 92% busy; GPU 0 runs busy"
    )
    assert "GPU 0 kept for it: starts when busy job 1 ends" in reason
    assert gpus_of(plan(gpus, running, [WaitingJob(3, 10 * G)]), 3) is not None
    # --share overrides it (the owner says this one is light): it starts.
    shared = WaitingJob(3, 10 * G, demand=0.92, owner_runs=5, share=True)
    assert gpus_of(plan(gpus, running, [shared]), 3) is not None
    # Expected light from its owner's runs (25 %), but no card stays within 100 % with
    # it: held as a light job of known demand, said so.
    expected_light = WaitingJob(3, 10 * G, demand=0.25, owner_runs=5)
    reason = plan(gpus, running, [expected_light]).waiting_reasons[3]
    assert reason.startswith(
        "waits for a quieter card (expected light: its owner's last 5 jobs were, and it has no"
        " runs of its own yet (--exclusive if it is not): it keeps a card 25% busy, and no"
        " card stays within 100 % with it;"
    )
    # Its own history says nothing of its owner: "it keeps", as before.
    own = plan(gpus, running, [WaitingJob(3, 10 * G, demand=0.92)]).waiting_reasons[3]
    assert "(it keeps a card 92% busy; GPU 0 runs busy job 1" in own


def test_a_job_of_unknown_demand_waits_only_where_every_card_is_full() -> None:
    # Both cards past 100 % by measured demands (a busy job and a light one on each): no
    # job of any demand would start, so neither does one of unknown demand (rule 3c); a
    # --share job still does.
    gpus = [card(0, 80, used_g=10), card(1, 80, used_g=10)]
    running = [
        job_on(1, 0, 5, demand=0.9),
        job_on(2, 0, 5, demand=0.3),
        job_on(3, 1, 5, demand=0.8),
        job_on(4, 1, 5, demand=0.4),
    ]
    unknown = WaitingJob(5, 4 * G)
    result = plan(gpus, running, [unknown])
    assert gpus_of(result, 5) is None
    assert result.quieter == {5}
    assert "its demand is not known yet, and every card it fits on" in result.waiting_reasons[5]
    # Jobs of unknown demand behind it with the same ask are held alike, each with its own
    # wait so far (the plan reuses the reason: a long queue of new jobs stays cheap).
    behind = [WaitingJob(6, 4 * G), WaitingJob(7, 4 * G, waited_s=720)]
    result = plan(gpus, running, [unknown, *behind])
    assert result.quieter == {5, 6, 7}
    assert "GPU 0 kept for it" in result.waiting_reasons[5]
    assert result.waiting_reasons[6].endswith("behind job 5, held for one too (pack: contention)")
    assert "for 12 min so far; behind job 5" in result.waiting_reasons[7]
    shared = WaitingJob(5, 4 * G, share=True)
    assert gpus_of(plan(gpus, running, [shared]), 5) is not None
    # Job 2 ends: GPU 0 runs 90 %, not full: it starts there, beside the busy job.
    assert gpus_of(plan(gpus, [running[0], *running[2:]], [unknown]), 5) == [0]
    # A job not measured yet counts for nothing here: with job 3's demand unknown, GPU 1
    # is not full (where no demand is ever measured, nothing waits for this).
    unmeasured = [*running[:2], job_on(3, 1, 5), running[3]]
    assert gpus_of(plan(gpus, unmeasured, [unknown]), 5) == [1]


@settings(max_examples=100, deadline=None)
@given(
    demands=st.lists(
        st.lists(st.none() | st.floats(0, 1), min_size=1, max_size=2), min_size=1, max_size=6
    ),
    job_demand=st.none() | st.floats(0, 1),
    behind=st.lists(st.none() | st.floats(0, 1), max_size=5),
)
def test_contention_never_starves_a_job(
    demands: list[list[float | None]], job_demand: float | None, behind: list[float | None]
) -> None:
    """A job waits for a quieter card only with a known demand, or (unknown) where every
    card is full by measured demands; it keeps a card that no job behind it takes, and
    once that card's jobs end it starts."""
    gpus = [card(i, 24, used_g=4) for i in range(len(demands))]
    running = [
        job_on(10 * i + k + 1, i, 2, demand=d)
        for i, on in enumerate(demands)
        for k, d in enumerate(on)
    ]
    job = WaitingJob(100, 4 * G, demand=job_demand)
    others = [WaitingJob(200 + k, 2 * G, demand=d) for k, d in enumerate(behind)]
    result = plan(gpus, running, [job, *others])
    if gpus_of(result, 100) is not None:
        return
    measured = [sum(d for d in on if d is not None) for on in demands]
    assert job_demand is not None or all(load > 1.0 for load in measured)
    kept = int(result.waiting_reasons[100].split(" kept for it")[0].rsplit("GPU ", 1)[1])
    assert all(gpus_of(result, o.job_id) != [kept] for o in others)
    freed = [card(i, 24) if i == kept else g for i, g in enumerate(gpus)]
    left = [c for c in running if c.gpu_uuids != (f"GPU-{kept}",)]
    assert gpus_of(plan(freed, left, [job, *others]), 100) is not None


def test_a_held_jobs_reason_names_a_few_cards_not_all() -> None:
    gpus = [card(i, 80, used_g=10) for i in range(6)]
    running = [job_on(i + 1, i, 10, demand=0.9) for i in range(6)]
    reason = plan(gpus, running, [WaitingJob(9, 4 * G, demand=0.9)]).waiting_reasons[9]
    assert reason.count(" runs busy job ") == 3
    assert "; 3 more cards alike" in reason


def test_an_exclusive_job_takes_an_empty_card_and_nothing_joins_it() -> None:
    gpus = [card(0, 80, used_g=4), card(1, 24)]
    running = [job_on(1, 0, 4)]
    mine = WaitingJob(2, 4 * G, exclusive=True)
    after = WaitingJob(3, 2 * G)
    result = plan(gpus, running, [mine, after])
    assert gpus_of(result, 2) == [1]
    assert gpus_of(result, 3) == [0]
    # Once it runs, nothing joins its card, even where memory would fit.
    gpus = [card(0, 24, used_g=24), card(1, 24, used_g=4)]
    running = [job_on(1, 0, 24), job_on(2, 1, 4, exclusive=True)]
    assert gpus_of(plan(gpus, running, [WaitingJob(4, 2 * G)]), 4) is None


# -- rule 4: topology -------------------------------------------------------------------------


def test_a_two_gpu_job_gets_the_pair_on_one_switch() -> None:
    # Issue 24 item 4: 0-1 and 2-3 each share a PCIe switch; a small job runs on GPU 0.
    gpus = [card(0, used_g=2), card(1), card(2), card(3)]
    topology = {
        f"GPU-{a}": {f"GPU-{b}": 10 if a // 2 == b // 2 else 30 for b in range(4) if b != a}
        for a in range(4)
    }
    result = plan(gpus, [job_on(1, 0, 2)], [WaitingJob(2, 8 * G, gpu_count=2)], topology=topology)
    assert gpus_of(result, 2) == [2, 3]


# -- rule 5: most-free (default) or best-fit --------------------------------------------------


def test_most_free_by_default_best_fit_as_an_option() -> None:
    gpus = [card(0, 80), card(1, 24)]
    assert gpus_of(plan(gpus, [], [WaitingJob(1, 20 * G)]), 1) == [0]
    assert gpus_of(plan(gpus, [], [WaitingJob(1, 20 * G)], placement="best-fit"), 1) == [1]


def test_a_whole_gpu_job_needs_a_card_nearly_free_of_others() -> None:
    # Issue 24 item 9: processes gpusched did not start hold 22 of 24G on the only card.
    result = plan([card(0, 24, others_g=22)], [], [WaitingJob(1, None)])
    assert result.placements == []
    assert "other processes" in result.waiting_reasons[1]
    assert "22G of 24G" in result.waiting_reasons[1]
    assert gpus_of(plan([card(0, 24, others_g=1)], [], [WaitingJob(1, None)]), 1) == [0]


# -- reasons ----------------------------------------------------------------------------------


def test_a_job_held_back_by_max_jobs_per_gpu_says_so() -> None:
    # Issue 24 item 13: it used to say "most available is 22.0G".
    result = plan(
        [card(0, used_g=2)], [job_on(1, 0, 2)], [WaitingJob(2, 4 * G)], max_jobs_per_gpu=1
    )
    assert "max_jobs_per_gpu 1" in result.waiting_reasons[2]
    assert "most available" not in result.waiting_reasons[2]


def test_a_whole_gpu_job_is_not_told_every_gpu_runs_jobs_while_one_runs_none() -> None:
    gpus = [card(0, used_g=2), card(1, others_g=20)]
    result = plan(gpus, [job_on(1, 0, 2)], [WaitingJob(2, None)])
    assert "every usable GPU runs gpusched jobs" not in result.waiting_reasons[2]
    assert "GPU 1 (other processes hold 20G of 24G)" in result.waiting_reasons[2]


def test_reasons_name_each_card_with_its_node_in_a_cluster() -> None:
    def slot(node: str, index: int, free_g: float) -> GpuSlot:
        return GpuSlot(f"{node}/GPU-{index}", index, 24 * G, int(free_g * G), node=node)

    gpus = [slot("a", 0, 4), slot("b", 0, 10)]
    running = [
        RunningClaim(1, ("a/GPU-0",), 20 * G, {"a/GPU-0": 20 * G}),
        RunningClaim(2, ("b/GPU-0",), 14 * G, {"b/GPU-0": 14 * G}),
    ]
    result = plan(gpus, running, [WaitingJob(3, 20 * G), WaitingJob(4, 12 * G)])
    assert "GPU 0 on b kept for it: starts when job 2 ends" in result.waiting_reasons[3]
    assert "most available is 4.0G on GPU 0 on a" in result.waiting_reasons[4]
    assert "GPU 0 on b kept for job 3 ahead of it" in result.waiting_reasons[4]


@settings(max_examples=150, deadline=None)
@given(
    places=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=2, max_size=7),
    busy=st.lists(st.integers(0, 20), min_size=7, max_size=7),
    count=st.integers(2, 4),
)
def test_a_multi_gpu_job_gets_a_tightest_set(
    places: list[tuple[int, int]], busy: list[int], count: int
) -> None:
    """Cards on (socket, switch): 10 on one switch, 30 on one socket, 50 across sockets;
    the set chosen is as tight as the tightest set of cards the job fits on."""
    n = len(places)
    gpus = [card(i, 24, used_g=busy[i]) for i in range(n)]
    running = [job_on(100 + i, i, busy[i]) for i in range(n) if busy[i]]

    def level(a: int, b: int) -> int:
        if places[a] == places[b]:
            return 10
        return 30 if places[a][0] == places[b][0] else 50

    topology = {f"GPU-{a}": {f"GPU-{b}": level(a, b) for b in range(n) if b != a} for a in range(n)}
    job = WaitingJob(1, 4 * G, gpu_count=count)
    result = plan(gpus, running, [job], topology=topology, pack="memory")
    fitting = [i for i in range(n) if 24 - busy[i] >= 4]
    chosen = gpus_of(result, 1)
    if len(fitting) < count:
        assert chosen is None
        return
    assert chosen is not None
    assert set(chosen) <= set(fitting)

    def tightness(cards: Sequence[int]) -> int:
        return max(level(a, b) for i, a in enumerate(cards) for b in cards[i + 1 :])

    best = min(tightness(c) for c in itertools.combinations(fitting, count))
    assert tightness(chosen) == best


def test_a_running_jobs_demand_is_its_utilization_only_while_alone_on_its_card() -> None:
    now = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
    started = "2026-01-05T08:50:00+00:00"

    def running(job_id: int, uuid: str) -> Job:
        return Job(
            job_id,
            "alice",
            1000,
            ["train.py"],
            "/",
            mem=4 * G,
            gpu_uuids=[uuid],
            started_at=started,
            time_limit_s=3600,
        )

    jobs = [running(1, "GPU-0"), running(2, "GPU-1"), running(3, "GPU-1")]
    utils = {1: 80.0, 2: 30.0, 3: 40.0}
    demands = {1: 0.8, 2: 0.3}  # as measured (UsageMonitor.job_demand), or its history
    claims = {
        c.job_id: c
        for c in running_claims(jobs, {}, utils.get, now, demand_of=lambda j: demands.get(j.id))
    }
    assert claims[1].demand == 0.8
    assert claims[2].demand == 0.3
    assert claims[3].demand is None  # not known yet
    assert claims[1].ends_in_s == 3000  # 50 of its 60 minutes left
