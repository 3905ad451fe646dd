"""The cards a job could start on now: the room that fits it, and the head's cards it may
backfill.

The room is the open cards no claim keeps, most available first (built when first asked
after a claim changed, then kept sorted by each placement). A job asking for `--mem` on
any card fits on a prefix of it; any other is tested card by card (exclusive's
`fits_now`). Then the head's claimed cards (head_claim): the head itself may take them,
and a job behind it where backfill allows, never the cards kept for a job held for a
quieter card. Pure.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpusched.scheduling.policy.budget import PlanGpu, by_room
from gpusched.scheduling.policy.card_limits import is_open
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.exclusive import fits_now
from gpusched.scheduling.policy.head_claim import Kept
from gpusched.scheduling.policy.state import PlanState


@dataclass(slots=True)  # not frozen: built for every job a pass considers
class Found:
    cards: list[PlanGpu]
    ordered: bool  # in the most-free order (no claimed card appended)
    prefix: int | None  # how many lead the room in its order (None: not a prefix of it)


def room_of(state: PlanState) -> list[PlanGpu]:
    """The open unclaimed cards, most available first."""
    if state.room is None:
        state.calm.clear()
        state.room = sorted(
            (g for g in state.gpus if state.unclaimed(g) and state.is_open(g)), key=by_room
        )
    return state.room


def candidates(state: PlanState, job: WaitingJob) -> Found:
    """The cards `job` fits on now, the room's first, then the head's it may backfill."""
    room = state.room
    if room is None:
        room = room_of(state)
    prefix: int | None
    if job.mem_bytes is not None and job.gpu_keys is None and not job.exclusive:
        # The room is sorted by available memory: the GPUs this job fits on are a prefix.
        prefix = bisect.bisect_right(room, -job.mem_bytes, key=lambda g: -g.available)
        found = room[:prefix]
    else:
        found = [g for g in room if fits_now(job, g)]
        prefix = None
    kept = state.kept
    if kept is None:
        return Found(found, True, prefix)
    backfill = _claimed_cards_for(state, kept, job)
    found.extend(backfill)
    return Found(found, not backfill, prefix)


def _claimed_cards_for(state: PlanState, kept: Kept, job: WaitingJob) -> list[PlanGpu]:
    """The head's cards `job` may take now: all for the head, where backfill allows for a
    job behind it; none kept for a job held for a quieter card (it is ahead)."""
    settings, cards = state.settings, []
    for card in kept.cards.values():
        gpu = card.gpu
        if gpu.slot.uuid in state.quiet_kept:
            continue
        if not is_open(gpu, settings.max_jobs_per_gpu, settings.busy_util):
            continue
        if not fits_now(job, gpu):
            continue
        if job is kept.job or kept.backfill(job, gpu) is not None:
            cards.append(gpu)
    return cards
