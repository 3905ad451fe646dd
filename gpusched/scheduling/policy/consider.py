"""One job's turn: the rules asked in today's order, placing it or saying why it waits.

1. The caps that hold a job back before any card is looked at: its array's
   `--max-concurrent` (array_cap), its owner's `max_running` (caps).
2. A reason given to a job with the same ask since the cards last changed (reasons).
3. The cards it fits on now (candidates: the open room, `max_jobs_per_gpu`/`busy_util`
   by card_limits, whole-GPU and `--exclusive` by exclusive, and the head's claimed cards
   where backfill allows, head_claim), on servers with its `--ram` and `--cpus` free
   (host: else it waits, claiming no card).
4. Contention's wait for a quieter card (contention, its bound by quieter), then the
   cards where sharing would slow it, or a job with a `--time` there, past its limit
   left out (time_limits: held for a quieter card alike when too few are left).
5. The card rules of choice: keep_for_bigger, contention, most_free, topology.
6. Its owner's `max_mem` on the cards chosen (caps), then the placement (placing).
7. A job that did not start is told why (why_not, turns' passed_by), and the first such
   job claims the cards that free soonest for it (head_claim), unless its cap or no card
   could ever hold it.
The order is the one the package's docstring lists, with three exceptions kept as they
are today: contention's wait (4) is decided before big cards are kept for big jobs (5's
first rule), the memory cap (6) is checked after the cards are chosen, and the head's
claim (7) is computed only after a job fails to start. Pure.
"""

from __future__ import annotations

from gpusched.scheduling.policy.array_cap import array_cap_reason
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.candidates import Found, candidates
from gpusched.scheduling.policy.caps import over_mem_cap, running_cap_reason
from gpusched.scheduling.policy.choice import choose_gpus
from gpusched.scheduling.policy.contention import contention_wait
from gpusched.scheduling.policy.data import UserCap, WaitingJob
from gpusched.scheduling.policy.head_claim import keep_for
from gpusched.scheduling.policy.host import host_wait
from gpusched.scheduling.policy.placing import place
from gpusched.scheduling.policy.quieter import quieter_parts, so_far, soonest_quiet
from gpusched.scheduling.policy.state import PlanState
from gpusched.scheduling.policy.time_limits import broken_time, within_time
from gpusched.scheduling.policy.words import need


def consider(state: PlanState, job: WaitingJob) -> bool:
    """Place `job` if it can start now, else say why; True when it was placed."""
    cap = state.settings.caps.get(job.user)
    said = _held_before_cards(state, job, cap)
    if said is not None:
        state.reasons.said[job.job_id] = said
        return False
    return consider_cards(state, job, cap)


def consider_cards(state: PlanState, job: WaitingJob, cap: UserCap | None) -> bool:
    """Steps 3 to 7, for a job that steps 1 and 2 let through (the turns ask step 2
    themselves of a job with no cap to ask: a long queue costs them a look-up a job)."""
    found = candidates(state, job)
    if len(found.cards) >= job.gpu_count:
        held = _held_for_host(state, job, found)
        if held is None:
            held = _held_for_quieter(state, job, found)
        if held is None:
            held = _held_for_time(state, job, found)
        chosen = _choose(state, job, found) if held is None else None
        if chosen:
            held = over_mem_cap(job, cap, state.tallies.held_bytes(job.user), chosen)
            if held is None:
                place(state, job, chosen)
                state.host.take(state.node_of(chosen), job.ram_bytes, job.cpus)
                return True
        if held is not None:
            state.reasons.said[job.job_id] = held
            return False
    _explain_wait(state, job, found, cap)
    return False


def _held_before_cards(state: PlanState, job: WaitingJob, cap: UserCap | None) -> str | None:
    """Steps 1 and 2: a cap that holds `job` back, or what its ask was told before."""
    said = None
    if job.array_cap is not None:  # (asked of every job a pass considers: only where set)
        said = array_cap_reason(job, state.tallies.array_running)
    if said is None and cap is not None:
        said = running_cap_reason(job, cap, state.tallies)
    if said is None:
        said = state.reasons.told_before(job)
    return said


def _held_for_host(state: PlanState, job: WaitingJob, found: Found) -> str | None:
    """Step 3 too: the host rule. The cards of servers without the host memory or cores
    `job` asks for free now are left out of `found`; with too few left it waits, saying
    why, and claims no card (module host). None: it need not."""
    if not (job.ram_bytes or job.cpus) or not state.settings.hosts:
        return None
    rooms, tally = state.settings.hosts, state.host
    said: dict[str, str | None] = {}
    for gpu in found.cards:
        node = gpu.slot.node
        if node not in said:
            said[node] = host_wait(job.ram_bytes, job.cpus, node, rooms, tally)
    if not any(said.values()):
        return None
    kept = [g for g in found.cards if said[g.slot.node] is None]
    if len(kept) < job.gpu_count:
        first = next(why for why in said.values() if why)
        return first if len(said) == 1 else f"{first} (on every node with room for its GPUs)"
    found.cards, found.prefix = kept, None
    return None


def _held_for_quieter(state: PlanState, job: WaitingJob, found: Found) -> str | None:
    """Step 4: the reason `job` waits for a quieter card; None: it need not. The first
    job held keeps the cards whose busy jobs end soonest (its bound)."""
    settings = state.settings
    if settings.pack != "contention":
        return None
    room = state.room
    if found.prefix is None or room is None:
        waits = contention_wait(job, found.cards)
    else:
        waits = state.calm.wait(job, found.cards, room, found.prefix)
    if not waits:
        return None
    return _hold(state, job, found)


def _held_for_time(state: PlanState, job: WaitingJob, found: Found) -> str | None:
    """Step 4 too: the cards where sharing would slow `job`, or a job with a `--time`
    there, past its limit are left out of `found` (module time_limits); with too few left
    it is held for a quieter card, as contention holds a busy job. None: it need not."""
    if state.settings.pack != "contention" or (job.time_limit_s is None and not state.timed):
        return None
    kept = within_time(job, found.cards)
    if len(kept) == len(found.cards):
        return None
    if len(kept) < job.gpu_count:
        broken = [g for g in found.cards if g not in kept]
        return _hold(state, job, found, own=broken_time(job, broken))
    found.cards, found.prefix = kept, None
    return None


def _hold(state: PlanState, job: WaitingJob, found: Found, own: str | None = None) -> str:
    """`job` is held for a quieter card: its reason (`own`: why, where not its demand).
    The first job held keeps the cards whose busy jobs end soonest (its bound)."""
    settings = state.settings
    state.reasons.held_for_quieter.add(job.job_id)
    if not state.quiet_kept:
        for gpu in soonest_quiet(found.cards, job.gpu_count):
            state.quiet_kept[gpu.slot.uuid] = job.job_id
        state.claims_changed()
    busy = state.reasons.busy_text(found.cards, settings.several_nodes)
    said, rest = quieter_parts(
        job,
        found.cards,
        state.quiet_kept,
        state.by_uuid,
        settings.several_nodes,
        busy=busy,
        own=own,
    )
    if job.demand is None and not job.share and job.job_id not in state.quiet_kept.values():
        state.reasons.held_unknown[job.ask] = (said, rest)  # every such job after it alike
    return f"{said}{so_far(job)}{rest}"


def _choose(state: PlanState, job: WaitingJob, found: Found) -> list[PlanGpu] | None:
    """Step 5: the cards the rules of choice give `job`; None: no set fits (one node)."""
    settings = state.settings
    return choose_gpus(
        job,
        found.cards,
        state.needs,
        placement=settings.placement,
        pack=settings.pack,
        topology=settings.topology,
        ordered=found.ordered,
    )


def _explain_wait(state: PlanState, job: WaitingJob, found: Found, cap: UserCap | None) -> None:
    """Step 7: why `job` fits on no card now, whose turn passed it, and the head's claim."""
    settings, reasons = state.settings, state.reasons
    why = reasons.why(
        job, state.gpus, state.kept, state.quiet_kept, by_uuid=state.by_uuid, settings=settings
    )
    if len(found.cards) < job.gpu_count and state.kept is not None:
        reasons.no_room[job.ask] = why  # said to the same ask until the cards change
    reasons.say(job.job_id, why)
    passed = state.passed_on.passed(job, state.by_uuid) if state.passed_on.latest_by_user else None
    if state.kept is None:
        _claim_for_head(state, job, cap)
    if passed is not None:
        reasons.said[job.job_id] += f"; {passed}"


def _claim_for_head(state: PlanState, job: WaitingJob, cap: UserCap | None) -> None:
    """The first job that did not start claims the cards that free soonest for it."""
    settings, reasons = state.settings, state.reasons
    # Not on a card kept for a job held for a quieter card: that job takes it first, and
    # the head would wait behind it there.
    claimable = state.gpus
    if state.quiet_kept:
        claimable = [g for g in state.gpus if g.slot.uuid not in state.quiet_kept]
    claim = keep_for(job, claimable, settings.stored_claim, settings.several_nodes)
    chosen_cards = [c.gpu for c in claim.cards.values()] if claim else []
    # A job its owner's cap holds back would not start on drained cards either.
    over = over_mem_cap(job, cap, state.tallies.held_bytes(job.user), chosen_cards)
    if over is not None:
        reasons.say(job.job_id, over)
    elif claim is None:
        # (Else it could fit only where a job held for a quieter card goes first.)
        if len(claimable) == len(state.gpus):
            reasons.said[job.job_id] += " (no GPU can hold it even when gpusched's jobs end)"
    else:
        state.kept = claim
        # Waiting for jobs to end: the claim says where and for which, in words short
        # enough for a status line; else (a cap on jobs per card, say) the reason above is
        # the one that says why.
        alone = " with --exclusive" if job.exclusive else ""
        said = f"needs {need(job)}{alone}" if claim.waits_for else reasons.said[job.job_id]
        reasons.say(job.job_id, f"{said}; {claim.reason(settings.several_nodes)}")
        state.claims_changed()
