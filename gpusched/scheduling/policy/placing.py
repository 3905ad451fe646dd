"""What placing a job changes: its cards' room, load and demand, the caps' tallies, the
fair-share trail, the head's backfill slack, and the room's order.

Only the chosen cards change: each leaves the room and goes back to its new place, if it
stays open and unclaimed. Remembered reasons are forgotten (reasons' `forget_placed`). Pure.
"""

from __future__ import annotations

import bisect

from gpusched.scheduling.policy.budget import (
    BUSY_DEMAND,
    NEW_JOB_UTIL,
    PlanGpu,
    by_room,
    job_demand,
)
from gpusched.scheduling.policy.caps import claimed_bytes
from gpusched.scheduling.policy.data import Placement, WaitingJob
from gpusched.scheduling.policy.state import PlanState


def place(state: PlanState, job: WaitingJob, chosen: list[PlanGpu]) -> None:
    """Start `job` on `chosen` in this plan."""
    state.calm.clear()
    state.tallies.count(job.user, job.array_id, claimed_bytes(job.mem_bytes, chosen))
    kept, room = state.kept, state.room
    for gpu in chosen:
        if job.top is None:  # an administrator's `top` is no fair share
            state.passed_on.note(job, gpu)
        if kept is not None and gpu.slot.uuid in kept.cards and job is not kept.job:
            kept.took(job, gpu, kept.backfill(job, gpu) or "")
        if room is not None and gpu in room:
            room.remove(gpu)
        _take(gpu, job)
        if room is not None and state.unclaimed(gpu) and state.is_open(gpu):
            bisect.insort(room, gpu, key=by_room)
    state.needs.remove(job.mem_bytes)
    if job.time_limit_s is not None:
        state.timed = True
    state.placements.append(Placement(job.job_id, tuple(g.slot.uuid for g in chosen)))
    state.reasons.forget_placed()


def _take(gpu: PlanGpu, job: WaitingJob) -> None:
    """`job`'s share of one of its cards."""
    demand = job_demand(job.demand, job.share)
    gpu.job_count += 1
    gpu.job_ids.append(job.job_id)
    gpu.load += NEW_JOB_UTIL
    gpu.demand += demand
    # Placed now, an unknown job counts as busy towards "full" until it is measured
    # (contention's is_full_card): several new jobs do not pile on one card in a pass.
    gpu.measured += demand
    if demand >= BUSY_DEMAND:
        gpu.busy_with.append(job.job_id)
    gpu.exclusive = gpu.exclusive or job.exclusive
    gpu.holds.append((job.job_id, job.mem_bytes, job.time_limit_s))
    if job.mem_bytes is None:
        gpu.whole = True
        gpu.available = 0
    else:
        gpu.available -= job.mem_bytes
