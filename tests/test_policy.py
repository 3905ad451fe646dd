"""The placement policy: plain examples for each rule, hypothesis for the invariants.

`plan()` is pure, so every test here builds a snapshot by hand and looks at the
result; the anti-starvation tests run a small discrete-time simulation (no sleeping)
that feeds each plan's placements back in as running claims.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpusched.scheduling.policy import (
    GpuBudget,
    GpuSlot,
    HeadClaim,
    Plan,
    RunningClaim,
    UserCap,
    WaitingJob,
    gpu_budgets,
    plan,
)

G = 2**30
M = 2**20
HEADROOM = 512 * M


def gpu(index: int, total_g: float = 24, free_g: float | None = None, **kw: Any) -> GpuSlot:
    total = int(total_g * G)
    free = total if free_g is None else int(free_g * G)
    return GpuSlot(f"GPU-{index}", index, total, free, **kw)


def claim(
    job_id: int, gpus: Sequence[int], mem_g: float | None, used_g: float = 0, user: str = ""
) -> RunningClaim:
    mem = None if mem_g is None else int(mem_g * G)
    return RunningClaim(
        job_id,
        tuple(f"GPU-{i}" for i in gpus),
        mem,
        {f"GPU-{i}": int(used_g * G) for i in gpus},
        user,
    )


def wait(
    job_id: int, mem_g: float | None, gpus: int = 1, priority: int = 0, user: str = ""
) -> WaitingJob:
    return WaitingJob(job_id, None if mem_g is None else int(mem_g * G), gpus, priority, user)


def where(result: Plan) -> dict[int, tuple[str, ...]]:
    return {p.job_id: p.gpu_uuids for p in result.placements}


# -- rule 1: budgets ------------------------------------------------------------------------


def test_budget_of_an_idle_gpu() -> None:
    budgets = gpu_budgets([gpu(0, 24)], [], HEADROOM)
    assert budgets == {"GPU-0": GpuBudget(0, 24 * G - HEADROOM, ())}


def test_budget_reserves_what_running_jobs_have_not_allocated_yet() -> None:
    # Job 1 declared 10G and uses 4G so far; job 2 declared 6G and uses nothing yet.
    # The driver sees 4G used, 20G free.
    budgets = gpu_budgets(
        [gpu(0, 24, free_g=20)], [claim(1, [0], 10, 4), claim(2, [0], 6)], HEADROOM
    )
    budget = budgets["GPU-0"]
    assert budget.reserved_bytes == 6 * G + 6 * G
    assert budget.available_bytes == 20 * G - HEADROOM - 12 * G
    assert budget.job_ids == (1, 2)


def test_budget_of_a_job_using_more_than_it_declared() -> None:
    budgets = gpu_budgets([gpu(0, 24, free_g=12)], [claim(1, [0], 8, 12)], 0)
    assert budgets["GPU-0"].reserved_bytes == 0  # max(0, declared - observed)
    assert budgets["GPU-0"].available_bytes == 12 * G


def test_budget_respects_other_processes() -> None:
    # Someone else's 10G process: NVML reports it as used, so it is simply not free.
    budgets = gpu_budgets([gpu(0, 24, free_g=14)], [], 0)
    assert budgets["GPU-0"] == GpuBudget(0, 14 * G, ())


def test_budget_whole_gpu_job_leaves_nothing() -> None:
    budgets = gpu_budgets([gpu(0, 24, free_g=20), gpu(1, 24)], [claim(1, [0], None, 4)], HEADROOM)
    assert budgets["GPU-0"].available_bytes == 0
    assert budgets["GPU-0"].reserved_bytes == 20 * G - HEADROOM
    assert budgets["GPU-0"].job_ids == (1,)
    assert budgets["GPU-1"].available_bytes == 24 * G - HEADROOM


def test_budget_multi_gpu_claim_counts_on_each_gpu() -> None:
    budgets = gpu_budgets([gpu(0), gpu(1), gpu(2)], [claim(7, [0, 2], 10)], 0)
    assert budgets["GPU-0"] == GpuBudget(10 * G, 14 * G, (7,))
    assert budgets["GPU-1"] == GpuBudget(0, 24 * G, ())
    assert budgets["GPU-2"] == GpuBudget(10 * G, 14 * G, (7,))


def test_budget_lost_gpu_has_nothing_available() -> None:
    budgets = gpu_budgets([gpu(0, usable=False)], [], 0)
    assert budgets["GPU-0"].available_bytes == 0


def test_budget_never_negative() -> None:
    # Declared claims beyond what is free (other processes grew since): nothing left, not < 0.
    budgets = gpu_budgets([gpu(0, 24, free_g=5)], [claim(1, [0], 16)], HEADROOM)
    assert budgets["GPU-0"].available_bytes == 0


def test_plan_reports_the_same_budgets() -> None:
    gpus = [gpu(0, 24, free_g=20), gpu(1, 16)]
    running = [claim(1, [0], 10, 4)]
    result = plan(gpus, running, [wait(2, 4)], HEADROOM)
    assert result.budgets == gpu_budgets(gpus, running, HEADROOM)  # before this plan's placements


# -- rule 2: order ----------------------------------------------------------------------------


def test_higher_priority_first() -> None:
    result = plan([gpu(0, 24)], [], [wait(1, 16), wait(2, 16, priority=5)], HEADROOM)
    assert where(result) == {2: ("GPU-0",)}
    assert 1 in result.waiting_reasons


def test_equal_priority_in_submit_order() -> None:
    result = plan([gpu(0, 24)], [], [wait(9, 16), wait(3, 16), wait(5, 16)], HEADROOM)
    assert where(result) == {3: ("GPU-0",)}
    assert set(result.waiting_reasons) == {5, 9}


def test_negative_priority_goes_last() -> None:
    result = plan([gpu(0, 24)], [], [wait(1, 16, priority=-1), wait(2, 16)], HEADROOM)
    assert where(result) == {2: ("GPU-0",)}


def test_input_order_does_not_matter() -> None:
    jobs = [wait(i, 3 + i % 5, priority=i % 3) for i in range(1, 9)]
    gpus = [gpu(0, 24, free_g=20), gpu(1, 16), gpu(2, 24, free_g=9)]
    expected = plan(gpus, [], jobs, HEADROOM)
    for order in itertools.islice(itertools.permutations(jobs), 0, 200, 37):
        assert plan(gpus, [], list(order), HEADROOM) == expected


# -- rule 3: where ----------------------------------------------------------------------------


def test_most_available_gpu_wins() -> None:
    gpus = [gpu(0, 24, free_g=10), gpu(1, 24, free_g=20), gpu(2, 24, free_g=15)]
    assert where(plan(gpus, [], [wait(1, 4)], HEADROOM)) == {1: ("GPU-1",)}


def test_reservations_count_towards_most_available() -> None:
    # GPU 1 looks emptier to the driver, but a running job there has 16G still to allocate.
    gpus = [gpu(0, 24, free_g=14), gpu(1, 24, free_g=24)]
    running = [claim(1, [1], 16)]
    assert where(plan(gpus, running, [wait(2, 4)], HEADROOM)) == {2: ("GPU-0",)}


def test_ties_go_to_the_lower_index() -> None:
    gpus = [gpu(2), gpu(0), gpu(1)]
    assert where(plan(gpus, [], [wait(1, 4)], HEADROOM)) == {1: ("GPU-0",)}


def test_each_placement_updates_what_is_left() -> None:
    gpus = [gpu(0, 24), gpu(1, 20)]
    result = plan(gpus, [], [wait(1, 10), wait(2, 10), wait(3, 10), wait(4, 10)], 0)
    assert where(result) == {1: ("GPU-0",), 2: ("GPU-1",), 3: ("GPU-0",), 4: ("GPU-1",)}


def test_multi_gpu_job_takes_the_roomiest_gpus() -> None:
    gpus = [gpu(0, 24, free_g=8), gpu(1, 24, free_g=20), gpu(2, 24, free_g=12), gpu(3, 24)]
    result = plan(gpus, [], [wait(1, 6, gpus=2)], HEADROOM)
    assert where(result) == {1: ("GPU-3", "GPU-1")}


def test_gpu_filled_by_other_processes_gets_no_job() -> None:
    gpus = [gpu(0, 24, free_g=1), gpu(1, 24, free_g=3)]
    result = plan(gpus, [], [wait(1, 4), wait(2, 2)], HEADROOM)
    assert where(result) == {2: ("GPU-1",)}
    assert "most available is 2.5G on GPU 1" in result.waiting_reasons[1]


def test_headroom_is_never_handed_out() -> None:
    assert where(plan([gpu(0, 24)], [], [wait(1, 24)], HEADROOM)) == {}
    assert where(plan([gpu(0, 24)], [], [wait(1, 23.5)], HEADROOM)) == {1: ("GPU-0",)}
    assert where(plan([gpu(0, 24)], [], [wait(1, 24)], 0)) == {1: ("GPU-0",)}


def test_running_job_that_has_not_allocated_keeps_its_claim() -> None:
    # The allocation-lag race: job 1 (16G) was launched a moment ago and the driver still
    # shows the card empty. A second 16G job must not go there.
    gpus = [gpu(0, 24, free_g=24)]
    result = plan(gpus, [claim(1, [0], 16, used_g=0)], [wait(2, 16), wait(3, 16)], HEADROOM)
    assert result.placements == []
    # The head (job 2) is told which card it waits on and for which job; the budget:
    # 24 - 0.5 headroom - 16 still reserved = 7.5G.
    assert (
        result.waiting_reasons[2]
        == "needs 16.0G on 1 GPU; GPU 0 kept for it: starts when job 1 ends"
    )
    assert result.budgets["GPU-0"].available_bytes == int(7.5 * G)
    assert result.waiting_reasons[3] == "needs 16.0G on 1 GPU; GPU 0 kept for job 2 ahead of it"


def test_two_jobs_in_one_plan_do_not_share_a_card_that_fits_one() -> None:
    result = plan([gpu(0, 24)], [], [wait(1, 16), wait(2, 16)], HEADROOM)
    assert where(result) == {1: ("GPU-0",)}


def test_running_job_that_allocated_part_holds_the_rest() -> None:
    gpus = [gpu(0, 24, free_g=18)]  # job 1 has 6G of its 16G so far
    running = [claim(1, [0], 16, used_g=6)]
    # 18 - 0.5 - (16 - 6) = 7.5G available: 7G fits, 8G does not.
    assert where(plan(gpus, running, [wait(2, 8)], HEADROOM)) == {}
    assert where(plan(gpus, running, [wait(3, 7)], HEADROOM)) == {3: ("GPU-0",)}


def test_whole_gpu_job_needs_a_card_without_gpusched_jobs() -> None:
    gpus = [gpu(0, 24, free_g=10), gpu(1, 24, free_g=20), gpu(2, 24), gpu(3, 24, free_g=22)]
    running = [claim(1, [1], 4, used_g=4), claim(2, [2], 1, used_g=0)]
    result = plan(gpus, running, [wait(3, None)], HEADROOM)
    # GPUs 1 and 2 run gpusched jobs; GPU 0 is mostly other processes' (14 of 24G: over
    # the whole-GPU tolerance); GPU 3 (2G held by others) is nearly free.
    assert where(result) == {3: ("GPU-3",)}


def test_whole_gpu_job_takes_the_card_for_itself() -> None:
    result = plan([gpu(0), gpu(1)], [], [wait(1, None), wait(2, 2), wait(3, 2)], HEADROOM)
    placed = where(result)
    assert placed[1] == ("GPU-0",)
    assert placed[2] == placed[3] == ("GPU-1",)


def test_nothing_joins_a_running_whole_gpu_job() -> None:
    gpus = [gpu(0, 24, free_g=24)]
    result = plan(gpus, [claim(1, [0], None)], [wait(2, 1), wait(3, None)], HEADROOM)
    assert result.placements == []
    assert set(result.waiting_reasons) == {2, 3}


def test_max_jobs_per_gpu() -> None:
    gpus = [gpu(0), gpu(1)]
    running = [claim(1, [0], 2)]
    result = plan(gpus, running, [wait(2, 2), wait(3, 2), wait(4, 2)], HEADROOM, max_jobs_per_gpu=1)
    assert where(result) == {2: ("GPU-1",)}
    assert set(result.waiting_reasons) == {3, 4}


def test_unusable_gpus_get_nothing() -> None:
    gpus = [gpu(0, usable=False), gpu(1, 24, free_g=6)]
    result = plan(gpus, [], [wait(1, 8), wait(2, 4), wait(3, None)], HEADROOM)
    assert where(result) == {2: ("GPU-1",)}


# -- reasons ------------------------------------------------------------------------------------


def test_reason_shape_for_memory() -> None:
    gpus = [gpu(0, 24, free_g=10), gpu(1, 24, free_g=16)]
    result = plan(
        gpus,
        [claim(1, [0], 8, used_g=8), claim(2, [1], 8, used_g=8)],
        [wait(3, 20), wait(4, 20)],
        HEADROOM,
    )
    # The head names the card kept for it and the job it waits for (issue 24 item 1);
    # the jobs behind it, the most any card has and the head they wait behind.
    assert (
        result.waiting_reasons[3]
        == "needs 20.0G on 1 GPU; GPU 1 kept for it: starts when job 2 ends"
    )
    assert result.waiting_reasons[4] == (
        "needs 20.0G on 1 GPU, most available is 9.5G on GPU 0; GPU 1 kept for job 3 ahead of it"
    )


def test_reason_for_a_multi_gpu_job() -> None:
    gpus = [gpu(0, 24, free_g=4), gpu(1, 24, free_g=4)]
    result = plan(gpus, [claim(1, [0, 1], 20, used_g=20)], [wait(2, 8, gpus=2)], HEADROOM)
    assert result.waiting_reasons[2] == (
        "needs 8.0G on each of 2 GPUs; GPUs 0, 1 kept for it: starts when job 1 ends"
    )


def test_reason_when_more_gpus_than_usable() -> None:
    gpus = [gpu(0), gpu(1), gpu(2, usable=False)]
    result = plan(gpus, [], [wait(1, 4, gpus=3), wait(2, 4)], HEADROOM)
    assert "needs 3 GPUs, 2 usable" in result.waiting_reasons[1]
    assert where(result) == {2: ("GPU-0",)}  # it blocks nothing: it can never run here


def test_reason_for_a_whole_gpu_job() -> None:
    result = plan([gpu(0)], [claim(1, [0], 2)], [wait(2, None)], HEADROOM)
    assert result.waiting_reasons[2].startswith("needs a whole GPU")


def test_reason_names_the_job_the_cards_are_kept_for() -> None:
    gpus = [gpu(0, 24, free_g=12), gpu(1, 24, free_g=12)]
    running = [claim(1, [0], 12, used_g=12), claim(2, [1], 12, used_g=12)]
    result = plan(gpus, running, [wait(3, 20, gpus=2), wait(4, 8)], HEADROOM)
    assert result.placements == []  # both cards are kept for job 3
    assert "kept for job 3" in result.waiting_reasons[4]


# -- rule 5: anti-starvation, one snapshot ----------------------------------------------------


def test_the_blocked_head_keeps_the_roomiest_card_and_small_jobs_use_the_other() -> None:
    gpus = [gpu(0, 24, free_g=12), gpu(1, 24, free_g=16)]
    running = [claim(1, [0], 12, used_g=12), claim(2, [1], 8, used_g=8)]
    result = plan(gpus, running, [wait(3, 20), wait(4, 4), wait(5, 4)], HEADROOM)
    # Job 3 cannot start; it keeps GPU 1 (most available). Jobs 4 and 5 fit on either card
    # but may only use GPU 0, so GPU 1 drains for job 3.
    assert where(result) == {4: ("GPU-0",), 5: ("GPU-0",)}
    assert set(result.waiting_reasons) == {3}


def test_a_job_that_can_never_fit_claims_nothing() -> None:
    # Other processes hold 10G on each card: a 20G job cannot run here until they go,
    # and gpusched cannot make them go. It must not idle the cards meanwhile.
    gpus = [gpu(0, 24, free_g=14), gpu(1, 24, free_g=14)]
    result = plan(gpus, [], [wait(1, 20), wait(2, 6), wait(3, 6)], HEADROOM)
    assert where(result) == {2: ("GPU-0",), 3: ("GPU-1",)}
    reason = result.waiting_reasons[1]
    assert reason.startswith("needs 20.0G on 1 GPU, most available is")
    assert "no GPU can hold it even when gpusched's jobs end" in reason


def test_a_hopeless_head_lets_the_next_blocked_job_claim() -> None:
    gpus = [gpu(0, 24, free_g=14), gpu(1, 24, free_g=12)]
    running = [claim(1, [1], 12, used_g=12)]
    result = plan(gpus, running, [wait(2, 24), wait(3, 20), wait(4, 4), wait(5, 10)], HEADROOM)
    # Job 2 can never fit (a 24G card less the headroom); job 3 could on GPU 1 once job 1
    # ends, so job 3 keeps GPU 1: job 4 goes to GPU 0, and job 5 (10G), which would fit
    # only on GPU 1 now, waits.
    assert "no GPU can hold it" in result.waiting_reasons[2]
    assert where(result) == {4: ("GPU-0",)}
    assert "kept for job 3" in result.waiting_reasons[5]


# -- per-user caps -------------------------------------------------------------------------


def test_max_running_cap() -> None:
    caps = {"alice": UserCap(max_running=2)}
    running = [claim(1, [0], 2, user="alice")]
    waiting = [wait(2, 2, user="alice"), wait(3, 2, user="alice"), wait(4, 2, user="bob")]
    result = plan([gpu(0)], running, waiting, HEADROOM, user_caps=caps)
    assert where(result) == {2: ("GPU-0",), 4: ("GPU-0",)}
    assert "max_running 2" in result.waiting_reasons[3]


def test_max_mem_cap_counts_a_whole_gpu_as_its_total() -> None:
    caps = {"alice": UserCap(max_mem_bytes=30 * G)}
    running = [claim(1, [0], None, user="alice")]  # 24G
    waiting = [wait(2, 8, user="alice"), wait(3, 6, user="alice")]
    result = plan([gpu(0), gpu(1)], running, waiting, HEADROOM, user_caps=caps)
    assert where(result) == {3: ("GPU-1",)}
    assert "max_mem 30.0G" in result.waiting_reasons[2]


def test_a_job_held_back_by_its_users_cap_keeps_no_card() -> None:
    """Rule 4: a capped job waits for its owner's jobs, not for room, so it claims nothing."""
    caps = {"alice": UserCap(max_mem_bytes=24 * G)}
    gpus = [gpu(0, 24, free_g=4), gpu(1, 24, free_g=6)]
    running = [claim(1, [0], 20, used_g=20, user="alice"), claim(2, [1], 18, 18, user="bob")]
    waiting = [wait(3, 8, user="alice"), wait(4, 4, user="bob")]
    result = plan(gpus, running, waiting, HEADROOM, user_caps=caps)
    # Job 3 does not fit anywhere now, and alice could not start it even if it did.
    # Holding GPU 1 for it would only keep bob's job 4 off the card.
    assert where(result) == {4: ("GPU-1",)}
    assert "max_mem 24.0G" in result.waiting_reasons[3]


# -- hypothesis: invariants of any plan ---------------------------------------------------------

UNIT = 256 * M  # sizes drawn in quarter-GiB steps, so equalities and ties happen often


@dataclass
class Scenario:
    gpus: list[GpuSlot]
    running: list[RunningClaim]
    waiting: list[WaitingJob]
    headroom: int
    max_jobs_per_gpu: int | None
    others: dict[str, int] = field(default_factory=dict)  # memory of non-gpusched processes


# Strategies built once: building them inside every draw is most of the cost of a run.
sizes = st.integers(1, 320).map(UNIT.__mul__)  # 256 MiB to 80 GiB
claim_mem = st.none() | sizes
job_mem = st.none() | sizes | st.integers(1, 80 * G)
users = st.sampled_from(["alice", "bob"])
usable_flags = st.sampled_from([True, True, True, False])


def share(draw: st.DrawFn, most: int) -> int:
    """0, all of `most`, or anything between: the edges are where overcommits hide."""
    kind = draw(st.integers(0, 2))
    return 0 if kind == 0 else most if kind == 1 else draw(st.integers(0, most))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 8))
    totals = [draw(st.integers(4, 320)) * UNIT for _ in range(n)]  # 1 to 80 GiB
    usable = [draw(usable_flags) for _ in range(n)]
    others = [share(draw, t // UNIT) * UNIT for t in totals]
    left = [t - o for t, o in zip(totals, others, strict=True)]  # what gpusched jobs may use
    running: list[RunningClaim] = []
    for job_id in range(1001, 1001 + draw(st.integers(0, 6))):
        count = draw(st.integers(1, min(3, n)))
        on = draw(st.permutations(range(n)))[:count]
        mem = draw(claim_mem)
        used: dict[str, int] = {}
        for i in on:
            used[f"GPU-{i}"] = share(draw, left[i] if mem is None else min(mem, left[i]))
            left[i] -= used[f"GPU-{i}"]
        user = draw(users)
        running.append(RunningClaim(job_id, tuple(f"GPU-{i}" for i in on), mem, used, user))
    gpus = [
        GpuSlot(f"GPU-{i}", i, totals[i], left[i], usable[i])  # free: what no process holds
        for i in range(n)
    ]
    ids = draw(st.lists(st.integers(1, 1000), unique=True, max_size=10))
    waiting = [
        WaitingJob(
            job_id, draw(job_mem), draw(st.integers(1, 3)), draw(st.integers(-2, 2)), draw(users)
        )
        for job_id in ids
    ]
    headroom = draw(st.sampled_from([0, 1, 256 * M, 512 * M, 2 * G]))
    max_jobs = draw(st.none() | st.integers(1, 3))
    return Scenario(
        gpus, running, waiting, headroom, max_jobs, {f"GPU-{i}": others[i] for i in range(n)}
    )


def run(s: Scenario) -> Plan:
    # Memory alone (rule 3, contention, is tested on its own): the scenarios' jobs have no
    # known demand, which would send each new job to an empty card first.
    return plan(s.gpus, s.running, s.waiting, s.headroom, s.max_jobs_per_gpu, pack="memory")


def first_in_order(waiting: Sequence[WaitingJob]) -> WaitingJob:
    """With no usage, users take turns from the one whose best job came first; a user's
    own jobs go by priority, then submit order."""
    best_of: dict[str, WaitingJob] = {}
    for job in sorted(waiting, key=lambda j: (-j.priority, j.job_id)):
        best_of.setdefault(job.user, job)
    return min(best_of.values(), key=lambda j: j.job_id)


def check_first_job_starts_whenever_it_fits(s: Scenario, result: Plan) -> None:
    """The first job in order starts if it fits, on the roomiest GPUs (when rule 2 does
    not tell the cards apart); else it does not."""
    if not s.waiting:
        return
    first = first_in_order(s.waiting)
    budgets = gpu_budgets(s.gpus, s.running, s.headroom)
    fits = []
    for g in s.gpus:
        jobs_on = budgets[g.uuid].job_ids
        if not g.usable or (s.max_jobs_per_gpu is not None and len(jobs_on) >= s.max_jobs_per_gpu):
            continue
        if first.mem_bytes is None:
            # a whole-GPU job needs a card without gpusched jobs, nearly free of others
            room = not jobs_on and g.total_bytes - g.free_bytes <= 0.10 * g.total_bytes
        else:
            room = budgets[g.uuid].available_bytes >= first.mem_bytes
        if room:
            fits.append(g.uuid)
    placed = where(result)
    if len(fits) < first.gpu_count:
        assert first.job_id not in placed
        return
    assert set(placed[first.job_id]) <= set(fits)
    slots = {g.uuid: g for g in s.gpus}
    larger = [
        j.mem_bytes
        for j in s.waiting
        if j.mem_bytes is not None and first.mem_bytes is not None and j.mem_bytes > first.mem_bytes
    ]

    def served(uuid: str) -> int:
        potential = slots[uuid].total_bytes - s.headroom - s.others[uuid]
        return sum(1 for m in larger if m <= potential)

    if len({served(u) for u in fits}) == 1:  # rule 2 does not tell them apart
        # ... on the GPUs with the most available memory, ties to the lower index.
        best = sorted(fits, key=lambda u: (-budgets[u].available_bytes, int(u.split("-")[1])))
        assert placed[first.job_id] == tuple(best[: first.gpu_count])


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plan_invariants(s: Scenario) -> None:
    result = run(s)
    slots = {g.uuid: g for g in s.gpus}
    jobs = {j.job_id: j for j in s.waiting}
    placed = where(result)

    # Each waiting job is placed at most once, and only waiting jobs are placed.
    assert len(placed) == len(result.placements)
    assert set(placed) <= set(jobs)

    new_mem: dict[str, int] = dict.fromkeys(slots, 0)
    new_count: dict[str, int] = dict.fromkeys(slots, 0)
    new_whole: dict[str, int] = dict.fromkeys(slots, 0)
    for job_id, uuids in placed.items():
        job = jobs[job_id]
        # (a) exactly gpu_count distinct GPUs that exist; (e) all of them usable.
        assert len(uuids) == job.gpu_count
        assert len(set(uuids)) == len(uuids)
        for uuid in uuids:
            assert slots[uuid].usable
            new_count[uuid] += 1
            if job.mem_bytes is None:
                new_whole[uuid] += 1
            else:
                new_mem[uuid] += job.mem_bytes

    for uuid, slot in slots.items():
        on = [c for c in s.running if uuid in c.gpu_uuids]
        observed = sum(c.used_bytes.get(uuid, 0) for c in on)
        others = slot.total_bytes - slot.free_bytes - observed
        assert others == s.others[uuid]  # the scenario is consistent
        # (b) no overcommit: running claims at max(declared, observed) plus new placements
        # fit in what neither the headroom nor other processes hold.
        if new_mem[uuid]:
            assert all(c.mem_bytes is not None for c in on)
            held = sum(max(c.mem_bytes or 0, c.used_bytes.get(uuid, 0)) for c in on)
            assert held + new_mem[uuid] <= slot.total_bytes - s.headroom - others
        # (c) a whole-GPU job is alone: no running job and nothing else new.
        if new_whole[uuid]:
            assert on == []
            assert new_count[uuid] == 1
        # (g) max_jobs_per_gpu.
        if new_count[uuid] and s.max_jobs_per_gpu is not None:
            assert len(on) + new_count[uuid] <= s.max_jobs_per_gpu

    # (d) a reason for every job left waiting, and only for those.
    assert set(result.waiting_reasons) == set(jobs) - set(placed)
    for reason in result.waiting_reasons.values():
        assert isinstance(reason, str)
        assert reason.strip()
        assert "\n" not in reason

    # (h) liveness, so that a plan that places nothing cannot pass the checks above.
    check_first_job_starts_whenever_it_fits(s, result)

    # (f) determinism, whatever order the jobs and claims come in.
    assert run(s) == result
    shuffled = Scenario(
        s.gpus, s.running[::-1], s.waiting[::-1], s.headroom, s.max_jobs_per_gpu, s.others
    )
    again = run(shuffled)
    assert where(again) == placed
    assert again.waiting_reasons == result.waiting_reasons


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.integers(1, 3), st.integers(1, 40))
def test_user_caps_hold(s: Scenario, max_running: int, max_mem_g: int) -> None:
    caps = {"alice": UserCap(max_running=max_running, max_mem_bytes=max_mem_g * G)}
    result = plan(s.gpus, s.running, s.waiting, s.headroom, s.max_jobs_per_gpu, user_caps=caps)
    slots = {g.uuid: g for g in s.gpus}
    jobs = {j.job_id: j for j in s.waiting}

    def declared(mem: int | None, uuids: Sequence[str]) -> int:
        return sum(slots[u].total_bytes if mem is None else mem for u in uuids)

    running = [c for c in s.running if c.user == "alice"]
    new = [p for p in result.placements if jobs[p.job_id].user == "alice"]
    if new:
        assert len(running) + len(new) <= max_running
        held = sum(declared(c.mem_bytes, c.gpu_uuids) for c in running)
        added = sum(declared(jobs[p.job_id].mem_bytes, p.gpu_uuids) for p in new)
        assert held + added <= max_mem_g * G


# -- anti-starvation over time: a discrete-time simulation ---------------------------------------


@dataclass
class Sim:
    """Two 24 GiB GPUs; every running job uses exactly what it declared (observed = declared)."""

    gpus_count: int = 2
    total: int = 24 * G
    others: int = 0  # held on each card by processes gpusched did not start
    headroom: int = HEADROOM
    running: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # id: gpu, mem, end
    waiting: dict[int, tuple[int, int]] = field(default_factory=dict)  # id: mem, duration
    started: dict[int, tuple[int, str]] = field(default_factory=dict)  # id: step, gpu
    next_id: int = 1
    claim: HeadClaim | None = None

    def start_now(self, gpu_index: int, mem_g: int, end_step: int) -> int:
        job_id = self.submit(mem_g, 0)
        self.waiting.pop(job_id)
        self.running[job_id] = (f"GPU-{gpu_index}", mem_g * G, end_step)
        return job_id

    def submit(self, mem_g: int, duration: int) -> int:
        job_id = self.next_id
        self.next_id += 1
        self.waiting[job_id] = (mem_g * G, duration)
        return job_id

    def step(self, now: int) -> Plan:
        for job_id in [j for j, (_, _, end) in self.running.items() if end <= now]:
            del self.running[job_id]
        slots = []
        for i in range(self.gpus_count):
            used = sum(m for (u, m, _) in self.running.values() if u == f"GPU-{i}")
            slots.append(GpuSlot(f"GPU-{i}", i, self.total, self.total - self.others - used))
        claims = [RunningClaim(j, (u,), m, {u: m}) for j, (u, m, _) in self.running.items()]
        waiting = [WaitingJob(j, m) for j, (m, _) in self.waiting.items()]
        # As the scheduler does: the head's claim is stored and handed to the next plan.
        result = plan(slots, claims, waiting, self.headroom, head_claim=self.claim)
        self.claim = result.head_claim
        for p in result.placements:
            mem, duration = self.waiting.pop(p.job_id)
            self.running[p.job_id] = (p.gpu_uuids[0], mem, now + duration)
            self.started[p.job_id] = (now, p.gpu_uuids[0])
        return result


def run_stream(
    sim: Sim, big: int, stream: Sequence[Sequence[tuple[int, int]]], limit: int = 100
) -> int | None:
    """Submit stream[t] at step t; return the step at which `big` starts (None: never)."""
    for now in range(limit):
        for mem_g, duration in stream[now] if now < len(stream) else ():
            sim.submit(mem_g, duration)
        sim.step(now)
        if big in sim.started:
            return now
    return None


def test_big_job_starts_within_the_longest_small_job_despite_a_stream() -> None:
    longest = 4
    sim = Sim()
    # Both cards are busy with small jobs when the big one arrives; neither can take it.
    for gpu_index, mem_g, end in [(0, 6, 3), (0, 6, 2), (0, 4, 4), (1, 6, 4), (1, 6, 1), (1, 2, 2)]:
        sim.start_now(gpu_index, mem_g, end)
    big = sim.submit(20, 10)
    first_small = big + 1
    # Every step, two small jobs (2-6 GiB) lasting 1-4 steps: always something to backfill.
    sizes = itertools.cycle([2, 4, 6, 3, 5])
    durations = itertools.cycle(range(1, longest + 1))
    stream = [[(next(sizes), next(durations)) for _ in range(2)] for _ in range(50)]
    started_at = run_stream(sim, big, stream)
    assert started_at is not None
    assert started_at <= longest
    # Backfill happened: small jobs submitted after the big one ran before it started...
    before = [j for j, (when, _) in sim.started.items() if j >= first_small and when < started_at]
    assert before
    # (Some may share the card the big job waits for: memory backfill, rule 1; the start
    # within the longest small job above is what says they never delayed it.)


def test_the_kept_card_does_not_move_when_another_card_catches_up() -> None:
    """The card the big job waits for stays its own until it drains.

    Step 0: GPU 0 holds 5G of small jobs (ending at step 2), GPU 1 holds 4G (ending at
    step 3); the big job keeps GPU 1, which has more room. At step 2 GPU 0's old jobs end
    while a 4G backfill job (until step 5) still runs there: both cards show 19.5G. If
    the big job then switched to GPU 0 (equal room, lower index), the next small job
    would go to GPU 1 and the big job would wait for the backfill job until step 5,
    though GPU 1 drains at step 3.
    """
    sim = Sim()
    for gpu_index, mem_g, end in [(0, 2, 2), (0, 3, 2), (1, 4, 3)]:
        sim.start_now(gpu_index, mem_g, end)
    big = sim.submit(20, 10)
    stream = [[(2, 1)], [(4, 4)], [(4, 3)]] + [[(2, 1)]] * 20
    started_at = run_stream(sim, big, stream)
    assert started_at == 3  # the moment the jobs it found on GPU 1 have ended
    assert sim.started[big][1] == "GPU-1"
    backfill = [j for j in sim.started if j > big]
    assert backfill


@settings(max_examples=300, deadline=None)
@example(
    initial=[(0, 2, 4), (0, 3, 4), (1, 2, 5), (1, 2, 5)],
    stream=[[]] * 3 + [[(4, 4)], [(2, 3), (2, 3)]],
)
@example(
    initial=[(0, 2, 2), (0, 3, 2), (1, 4, 3)],
    stream=[[(2, 1)], [(4, 4)], [(4, 3)]] + [[(2, 1)]] * 12,
)
@given(
    initial=st.lists(
        st.tuples(st.integers(0, 1), st.integers(2, 6), st.integers(1, 5)), min_size=1, max_size=8
    ),
    stream=st.lists(
        st.lists(st.tuples(st.integers(2, 6), st.integers(1, 5)), max_size=3),
        min_size=1,
        max_size=30,
    ),
)
def test_big_job_never_starves(
    initial: list[tuple[int, int, int]], stream: list[list[tuple[int, int]]]
) -> None:
    """Whatever the stream of small jobs, the big one starts once the jobs it found have ended."""
    longest = 5
    sim = Sim()
    for gpu_index, mem_g, end in initial:
        sim.start_now(gpu_index, mem_g, end)
    big = sim.submit(20, 1)
    started_at = run_stream(sim, big, stream)
    assert started_at is not None
    assert started_at <= longest


def test_hopeless_big_job_does_not_stop_small_jobs_anywhere() -> None:
    sim = Sim(others=10 * G)  # another user's processes hold 10G of each 24G card
    big = sim.submit(20, 10)
    smalls = [sim.submit(4, 2) for _ in range(6)]
    result = sim.step(0)
    assert big not in sim.started
    assert "no GPU can hold it" in result.waiting_reasons[big]
    used_gpus = {sim.started[j][1] for j in smalls if j in sim.started}
    assert used_gpus == {"GPU-0", "GPU-1"}


# -- rule 6: compute-aware admission (busy_util) ------------------------------------------------


def test_busy_gpu_takes_no_new_job_even_with_the_most_memory() -> None:
    gpus = [gpu(0, util_percent=100.0), gpu(1, free_g=12, util_percent=10.0)]
    result = plan(gpus, [], [wait(1, 4)], HEADROOM, busy_util=90)
    assert where(result) == {1: ("GPU-1",)}
    # Off (the default), memory alone decides.
    assert where(plan(gpus, [], [wait(1, 4)], HEADROOM)) == {1: ("GPU-0",)}


def test_load_is_the_higher_of_the_gpu_reading_and_its_jobs_plus_unmeasured_jobs() -> None:
    measured = RunningClaim(1, ("GPU-0",), 2 * G, {"GPU-0": G}, util_percent=50.0)
    unmeasured = RunningClaim(2, ("GPU-1",), 2 * G, {}, util_percent=None)
    gpus = [gpu(0, util_percent=20.0), gpu(1, util_percent=0.0)]
    # GPU 0: max(20, 50) = 50 < 60, open. GPU 1: 0 + 100 for the job not measured yet.
    result = plan(gpus, [measured, unmeasured], [wait(3, 4), wait(4, 4)], HEADROOM, busy_util=60)
    assert where(result) == {3: ("GPU-0",)}
    # Job 3 now counts as 100 % on GPU 0 too: job 4 waits, and says both cards are busy.
    reason = result.waiting_reasons[4]
    assert "busy" in reason and "GPU 0 at 150 %" in reason and "GPU 1 at 100 %" in reason


def test_unknown_gpu_utilization_counts_as_idle() -> None:
    result = plan([gpu(0, util_percent=None)], [], [wait(1, 4)], HEADROOM, busy_util=50)
    assert where(result) == {1: ("GPU-0",)}


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.data())
def test_busy_gpus_never_get_a_job_and_each_gpu_at_most_one_per_plan(
    s: Scenario, data: st.DataObject
) -> None:
    percent = st.none() | st.floats(0, 100)
    gpus = [replace(g, util_percent=data.draw(percent)) for g in s.gpus]
    running = [replace(c, util_percent=data.draw(percent)) for c in s.running]
    busy_util = data.draw(st.floats(1, 100))
    result = plan(gpus, running, s.waiting, s.headroom, s.max_jobs_per_gpu, busy_util=busy_util)

    def load(slot: GpuSlot) -> float:
        on = [c for c in running if slot.uuid in c.gpu_uuids]
        known = sum(c.util_percent for c in on if c.util_percent is not None)
        return max(slot.util_percent or 0.0, known) + 100.0 * sum(
            c.util_percent is None for c in on
        )

    loads = {g.uuid: load(g) for g in gpus}
    new_on: dict[str, int] = {}
    for placement in result.placements:
        for uuid in placement.gpu_uuids:
            assert loads[uuid] < busy_util, (uuid, loads[uuid], busy_util)
            new_on[uuid] = new_on.get(uuid, 0) + 1
    # A placed job counts as 100 % until measured, so a card gets at most one per plan.
    assert all(count == 1 for count in new_on.values()), new_on
