"""The scheduling policy: a pure function from a snapshot to placements.

`plan()` takes plain data (GPUs as read now, the claims of running jobs, the jobs
that may start, the head's stored claim) and returns plain data (which job goes where,
why each other job waits, the head's claim to store). No I/O, no clock, no randomness.

What a GPU has left is gpu_budget's: NVML's free memory less the headroom and, for each
running gpusched job, what it declared and has not allocated yet (`busy_util`: a GPU
loaded at or above it takes no new job).

The order. Jobs an administrator put first (`gpusched top`) go first, in the order they
were put there. Then users take turns: the user with the fewest placements so far in
this plan goes next, ties to the one who used least recently (fair share: decayed GPU
memory-time, `decayed_usage`), then to the one whose next job was submitted first. A
user's own jobs go by their `--priority` (higher first), then submit order: a priority
never passes another user's job. Taking turns means a user with no recent use cannot
fill every free slot in one pass. Per-array (`--max-concurrent`) and per-user caps
(`limits:`) hold a job back with a reason; such a job claims no GPU.

How a card is chosen (one ordered rule; docs/operations.md "How a card is chosen"):

1. The head's claim, by memory. The first job in the order that cannot start now (the
   head) claims the card(s) expected to free soonest for it (module head_claim: the
   remaining --time of the jobs it waits for, else the least memory to free). The claim
   is stored and kept while that job is head. A job behind it may start on a claimed
   card only when the head still fits there once the jobs it waits for end (memory
   backfill), or when its own --time ends before the head's earliest start (time
   backfill). A job that could not fit even on empty GPUs claims nothing.
2. A job does not take the only cards a waiting larger job could use.
3. Contention (`pack: contention`, the default; `pack: memory` skips it). A job's
   demand is the share of a card's busy time it needs alone (measured while it runs,
   else its history); unknown counts as busy when choosing, `--share` as light. Each
   choice was tuned on benchmarks/packing.py (docs/benchmarks.md, with its gains):
   a. Quiet first: a card whose jobs' demands plus this job's stay within 100 %; among
      quiet cards, one with no busy job (a job that waits on data beside a busy one has
      its bursts stretched about 2x: FIELD.md's C+S row).
   b. A card already busy: its jobs together keep it at least 50 % busy (one busy job, or
      light ones that add up: a job beside three 30 % ones is stretched as beside a
      busy one). A card full: its jobs' measured demands pass 100 % (a job not measured
      yet counts for nothing, one placed in this plan with no history as busy). No
      quiet card: a job of unknown demand takes a card not full, of those one not busy
      yet, then it or a `--share` job the least loaded card.
   c. A job waits for a quieter card, whatever its wait so far: a busy one (demand >=
      50 %) when every card it fits on is busy already; a light one when none stays
      quiet with it; one of unknown demand only where every card it fits on is full (it
      never waits because its demand is unknown); a `--share` job never. Its bound: the
      first such job in the order keeps the card(s) whose busy jobs (else all) end
      soonest; no job behind it starts there, so it starts once those end (rule 1's way).
   `--exclusive`: a card with no other gpusched job, which then takes none.
4. A multi-GPU job gets the tightest set by NVML topology (common ancestor level).
5. Among what remains, the most available memory (`placement: most-free`, the default,
   the mission's rule), or the least that fits (`placement: best-fit`); ties to the lower
   index. A whole-GPU job (no --mem) needs a card with no gpusched job, others' processes
   holding at most WHOLE_GPU_OTHERS_MAX (10 %) of it.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence

from gpusched.scheduling.gpu_budget import (
    NEW_JOB_UTIL,
    GpuSlot,
    PlanGpu,
    RunningClaim,
    budget_table,
    by_room,
    is_open,
    job_demand,
)
from gpusched.scheduling.gpu_choice import (
    CalmRoom,
    Needs,
    Topology,
    choose_gpus,
    contention_wait,
    fits_now,
)
from gpusched.scheduling.head_claim import HeadClaim, Kept, keep_for
from gpusched.scheduling.plan_types import Ask, Placement, Plan, UserCap, WaitingJob
from gpusched.scheduling.quieter_cards import (
    SHOWN_CARDS,
    busy_cards,
    kept_quiet,
    quieter_parts,
    so_far,
    soonest_quiet,
)
from gpusched.scheduling.turns import UsageSpan, decayed_usage, in_turns, passed_by, submit_place
from gpusched.scheduling.waiting_reasons import Claims, claimed_bytes, over_mem_cap, why_not
from gpusched.scheduling.waiting_reasons import need as _need
from gpusched.scheduling.waiting_reasons import running_tallies as _tallies

__all__ = [
    "HeadClaim",
    "Placement",
    "Plan",
    "UsageSpan",
    "UserCap",
    "WaitingJob",
    "decayed_usage",
    "in_turns",
    "plan",
]


def plan(
    gpus: Sequence[GpuSlot],
    running: Sequence[RunningClaim],
    waiting: Sequence[WaitingJob],
    headroom_bytes: int = 0,
    max_jobs_per_gpu: int | None = None,
    *,
    user_caps: Mapping[str, UserCap] | None = None,
    user_usage: Mapping[str, float] | None = None,
    busy_util: float | None = None,
    head_claim: HeadClaim | None = None,
    topology: Topology | None = None,
    placement: str = "most-free",
    pack: str = "contention",
) -> Plan:
    """Decide which waiting jobs start now and where (the module's rules, in order), and
    which cards the blocked head keeps (`head_claim`: last plan's, to keep). Pure."""
    table = budget_table(gpus, running, headroom_bytes)
    budgets = {uuid: budget for uuid, (budget, _) in table.items()}
    state = [gpu for _, gpu in table.values()]
    placements: list[Placement] = []
    reasons: dict[int, str] = {}
    caps = user_caps or {}
    by_uuid = {gpu.slot.uuid: gpu for gpu in state}
    user_running, user_bytes, array_running = _tallies(running, by_uuid)
    usage = user_usage or {}
    needs = Needs(waiting, state)
    calm = CalmRoom()  # rule 3c's calm cards of `room`, listed once per change of it
    busy_text: dict[tuple[int, ...], str] = {}  # what runs on the cards a held job fits
    kept: Kept | None = None
    # Jobs that ask for the same thing get the same "no" until a placement or a claim
    # changes the GPUs: memoised, a pass over 10,000 waiting jobs stays cheap.
    room: list[PlanGpu] | None = None  # open unclaimed GPUs, most available first
    claims: Claims | None = None  # for waiting reasons; None: build it when next needed
    why_by_need: dict[Ask, str] = {}
    no_room: dict[Ask, str] = {}  # asks that found too few cards, and their reason
    # Asks of unknown demand held for a quieter card behind the job the cards are kept
    # for: every such job after it is held alike until the cards change (a long queue of
    # new jobs on full cards stays cheap). The reason's parts around "so far".
    held_unknown: dict[Ask, tuple[str, str]] = {}
    several_nodes = len({gpu.node for gpu in gpus}) > 1
    held_for_quieter: set[int] = set()
    # Rule 3's bound: the cards kept for the first job held for a quieter card (no job
    # behind it starts there, so they turn quiet as their busy jobs end).
    quiet_kept: dict[str, int] = {}  # uuid -> the job they are kept for
    # What other users' jobs took in this plan, per card: (their place in submit order,
    # user, job id, memory): a job they passed by taking turns is told so (`_passed_by`).
    passed_on: dict[str, list[tuple[int, str, int, int | None]]] = {}
    latest_by_user: dict[str, int] = {}  # the latest submit place each user took a card with

    def candidates(job: WaitingJob) -> tuple[list[PlanGpu], bool, int | None]:
        """The cards `job` fits on now, whether they are in most-free order, and how many
        of them lead the room in its order (None: not a prefix of it)."""
        nonlocal room
        if room is None:
            calm.clear()
            room = sorted(
                (
                    g
                    for g in state
                    if (kept is None or g.slot.uuid not in kept.cards)
                    and g.slot.uuid not in quiet_kept
                    and is_open(g, max_jobs_per_gpu, busy_util)
                ),
                key=by_room,
            )
        if job.mem_bytes is not None and job.gpu_keys is None and not job.exclusive:
            # `room` is sorted by available memory: the GPUs this job fits on are a prefix.
            end = bisect.bisect_right(room, -job.mem_bytes, key=lambda g: -g.available)
            found = room[:end]
            prefix: int | None = end
        else:
            found = [g for g in room if fits_now(job, g)]
            prefix = None
        ordered = True
        if kept is not None:
            for card in kept.cards.values():
                gpu = card.gpu
                if gpu.slot.uuid in quiet_kept:  # kept for a job ahead, held for quiet
                    continue
                if not is_open(gpu, max_jobs_per_gpu, busy_util) or not fits_now(job, gpu):
                    continue
                if job is kept.job or kept.backfill(job, gpu) is not None:
                    found.append(gpu)
                    ordered = False
        return found, ordered, prefix

    def place(job: WaitingJob, chosen: list[PlanGpu]) -> None:
        nonlocal room, claims
        calm.clear()
        busy_text.clear()
        user_running[job.user] = user_running.get(job.user, 0) + 1
        user_bytes[job.user] = user_bytes.get(job.user, 0) + claimed_bytes(job.mem_bytes, chosen)
        for gpu in chosen:
            if job.top is None:  # an administrator's `top` is no fair share
                passed_on.setdefault(gpu.slot.uuid, []).append(
                    (submit_place(job), job.user, job.job_id, job.mem_bytes)
                )
                latest_by_user[job.user] = max(latest_by_user.get(job.user, 0), submit_place(job))
            if kept is not None and gpu.slot.uuid in kept.cards and job is not kept.job:
                kept.took(job, gpu, kept.backfill(job, gpu) or "")
            if room is not None and gpu in room:
                room.remove(gpu)
            gpu.job_count += 1
            gpu.job_ids.append(job.job_id)
            gpu.load += NEW_JOB_UTIL
            gpu.demand += job_demand(job.demand, job.share)
            # Placed now, an unknown job counts as busy towards "full" until it is measured
            # (gpu_choice.is_full_card): several new jobs do not pile on one card in a pass.
            gpu.measured += job_demand(job.demand, job.share)
            if job_demand(job.demand, job.share) >= 0.5:
                gpu.busy_with.append(job.job_id)
            gpu.exclusive = gpu.exclusive or job.exclusive
            hold = job.mem_bytes
            gpu.holds.append((job.job_id, hold, job.time_limit_s))
            if job.mem_bytes is None:
                gpu.whole = True
                gpu.available = 0
            else:
                gpu.available -= job.mem_bytes
            # Only the chosen GPUs changed: each goes back to its new place, if any.
            unclaimed = (
                kept is None or gpu.slot.uuid not in kept.cards
            ) and gpu.slot.uuid not in quiet_kept
            if room is not None and unclaimed and is_open(gpu, max_jobs_per_gpu, busy_util):
                bisect.insort(room, gpu, key=by_room)
        if job.array_id is not None:
            array_running[job.array_id] = array_running.get(job.array_id, 0) + 1
        needs.remove(job.mem_bytes)
        placements.append(Placement(job.job_id, tuple(g.slot.uuid for g in chosen)))
        claims = None
        why_by_need.clear()
        held_unknown.clear()
        no_room.clear()

    def told_before(job: WaitingJob) -> str | None:
        """The reason a job with the same ask got since the cards last changed, where it
        holds for this one too (asked after its caps)."""
        if held_unknown and job.demand is None and not job.share:
            held = held_unknown.get(job.ask)
            if held is not None:
                held_for_quieter.add(job.job_id)
                return f"{held[0]}{so_far(job) if job.waited_s >= 60 else ''}{held[1]}"
        return no_room.get(job.ask) if kept is not None and no_room else None

    def consider(job: WaitingJob) -> bool:
        """Place `job` if it can start now, else say why; True when it was placed."""
        nonlocal kept, room, claims
        if job.array_cap is not None and job.array_id is not None:
            in_array = array_running.get(job.array_id, 0)
            if in_array >= job.array_cap:
                reasons[job.job_id] = (
                    f"array limit: {in_array} of array a{job.array_id} running"
                    f" (--max-concurrent {job.array_cap})"
                )
                return False
        cap = caps.get(job.user)
        if cap is not None and cap.max_running is not None:
            count = user_running.get(job.user, 0)
            if count >= cap.max_running:
                reasons[job.job_id] = (
                    f"user limit: {job.user} has {count} running (max_running {cap.max_running})"
                )
                return False
        key = job.ask
        unknown = job.demand is None and not job.share
        said_before = told_before(job)
        if said_before is not None:
            reasons[job.job_id] = said_before
            return False
        found, ordered, prefix = candidates(job)
        if len(found) >= job.gpu_count:
            held = None
            if pack == "contention" and (
                contention_wait(job, found)
                if prefix is None or room is None
                else calm.wait(job, found, room, prefix)
            ):
                held_for_quieter.add(job.job_id)
                if not quiet_kept:
                    for gpu in soonest_quiet(found, job.gpu_count):
                        quiet_kept[gpu.slot.uuid] = job.job_id
                    room = None
                    claims = None
                    why_by_need.clear()
                    held_unknown.clear()
                    no_room.clear()
                # What runs on the first cards found: the same for every held job that
                # fits on as many cards, until a placement changes them.
                shown = (len(found), *map(id, found[:SHOWN_CARDS]))
                if shown not in busy_text:
                    busy_text[shown] = busy_cards(found, several_nodes)
                said, rest = quieter_parts(
                    job, found, quiet_kept, by_uuid, several_nodes, busy=busy_text[shown]
                )
                held = f"{said}{so_far(job)}{rest}"
                if unknown and job.job_id not in quiet_kept.values():
                    held_unknown[key] = (said, rest)
            chosen = held is None and choose_gpus(
                job,
                found,
                needs,
                placement=placement,
                pack=pack,
                topology=topology,
                ordered=ordered,
            )
            if chosen:
                held = over_mem_cap(job, cap, user_bytes.get(job.user, 0), chosen)
                if held is None:
                    place(job, chosen)
                    return True
            if held is not None:
                reasons[job.job_id] = held
                return False
        if key not in why_by_need:
            if claims is None:
                claims = Claims.of(state, kept, max_jobs_per_gpu, several_nodes, quiet_kept)
            why_by_need[key] = why_not(job, claims, busy_util, several_nodes)
            if quiet_kept:
                why_by_need[key] += kept_quiet(job, quiet_kept, by_uuid, several_nodes)
        if len(found) < job.gpu_count:
            no_room[key] = why_by_need[key]
        reasons[job.job_id] = why_by_need[key]
        passed = None
        its_place = submit_place(job)
        if latest_by_user and any(
            u != job.user and p > its_place for u, p in latest_by_user.items()
        ):
            passed = passed_by(job, passed_on, by_uuid)
        if kept is None:
            # Not on a card kept for a job held for a quieter card (rule 3): that job
            # takes it first, and the head would wait behind it there.
            claimable = [g for g in state if g.slot.uuid not in quiet_kept] if quiet_kept else state
            claim = keep_for(job, claimable, head_claim, several_nodes)
            chosen_cards = [c.gpu for c in claim.cards.values()] if claim else []
            # A job its owner's cap holds back would not start on drained cards either.
            over = over_mem_cap(job, cap, user_bytes.get(job.user, 0), chosen_cards)
            if over is not None:
                reasons[job.job_id] = over
            elif claim is None:
                # (Else it could fit only where a job held for a quieter card goes first.)
                if len(claimable) == len(state):
                    reasons[job.job_id] += " (no GPU can hold it even when gpusched's jobs end)"
            else:
                kept = claim
                # Waiting for jobs to end: the claim says where and for which, in words
                # short enough for a status line; else (a cap on jobs per card, say)
                # the reason above is the one that says why.
                said = f"needs {_need(job)}" if claim.waits_for else reasons[job.job_id]
                reasons[job.job_id] = f"{said}; {claim.reason(several_nodes)}"
                room = None
                claims = None
                why_by_need.clear()
                held_unknown.clear()
                no_room.clear()
        if passed is not None:
            reasons[job.job_id] += f"; {passed}"
        return False

    topped, queues = in_turns(waiting, usage)
    for job in topped:
        consider(job)
    turns = [
        (0, usage.get(user, 0.0), submit_place(queue[-1]), user) for user, queue in queues.items()
    ]
    heapq.heapify(turns)
    while turns:
        taken, used, _, user = heapq.heappop(turns)
        queue = queues[user]
        # A job with no cap to ask gets what its ask was told before, where that holds,
        # without the rest of `consider`: a long queue costs a look-up a job.
        capped = (cap := caps.get(user)) is not None and cap.max_running is not None
        while queue:  # this user's jobs for as long as the user stays first (or is last)
            job = queue.pop()
            said = told_before(job) if job.array_cap is None and not capped else None
            if said is not None:
                reasons[job.job_id] = said
            else:
                taken += consider(job)
            if queue and turns:
                turn = (taken, used, submit_place(queue[-1]), user)
                if turn > turns[0]:
                    heapq.heappush(turns, turn)
                    break
    return Plan(
        placements,
        reasons,
        budgets,
        kept.claim if kept is not None else None,
        frozenset(held_for_quieter),
    )
