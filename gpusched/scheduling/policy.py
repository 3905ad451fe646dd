"""The scheduling policy: a pure function from a snapshot to placements.

`plan()` takes plain data (GPUs as read now, the claims of running jobs, the jobs
that may start) and returns plain data (which job goes where, and why each other job
waits). No I/O, no clock, no randomness: tests drive it with hypothesis and the
benchmarks call it in a loop.

What each GPU has left (rules 1 and 6 below) is module gpu_budget's; the order, the
placements, the claims of rule 5, the caps and the waiting reasons are this module's.

The rules, in order:

1. A GPU's available memory is what NVML says is free, minus the headroom, minus for
   each running gpusched job on it max(0, declared - what the job's processes use now).
   A job that has launched but not yet allocated still holds its whole claim; memory
   held by processes gpusched did not start is respected because NVML counts it.
   A GPU that runs a whole-GPU job (no --mem) has nothing available. Lost and
   excluded GPUs have nothing available.
2. Waiting jobs are taken by fair share, then priority (higher first), then submit
   order. Fair share: a user's recent GPU memory-time (bytes x seconds of declared
   memory, decayed with a half-life; see `decayed_usage`); the user who used least goes
   first. A single user's jobs therefore keep priority-then-FIFO order, and with equal
   use the order is plain priority then submit time. The usage is that of the snapshot:
   within one plan a user's placements do not raise it, the next plan sees them.
3. A job starts on the N GPUs with the most available memory among those where it
   fits (each needs `mem` available, or no gpusched job at all for a whole-GPU job,
   and fewer than `max_jobs_per_gpu` jobs).
4. Per-array caps (`submit --sweep ... --max-concurrent K`): at most K jobs of one
   array run at once; the others wait ("array limit") and claim nothing.
   Per-user caps (`limits:` in the config): a job that would take its user past
   `max_running` jobs or `max_mem` of declared GPU memory (a whole GPU counts as its
   total) waits, and says which limit; it claims no GPU, since it waits for its owner's
   own jobs, not for room.
5. Anti-starvation ("the head keeps its cards"): the first job in that order that
   cannot start claims the N GPUs on which it could fit once gpusched's running jobs
   end (preferring those that run no job submitted after it, then those with the most
   available now). No job behind it may start on a claimed GPU, so those cards drain
   and the blocked job starts as soon as its claimed GPUs have room. Jobs behind it may
   still start on unclaimed GPUs, which is how small jobs pass a big one without ever
   delaying it. The first preference keeps the claim on the same cards from one plan
   to the next (they get no newer job; the cards left to others do): chosen by room
   alone, the claim would move whenever another card caught up (its old jobs ended
   while a backfilled one still ran) and the card it left would be refilled, each move
   restarting the wait. A job that could not fit even on empty GPUs (other processes
   hold the memory) claims nothing: holding cards for it would idle them for a wait
   gpusched cannot end.
6. Compute (only with `busy_util` set; off by default, when memory alone decides): a GPU
   whose compute load is at or above `busy_util` percent takes no new job. Its load is
   the higher of its own recent utilization (every process on it) and the sum of its
   gpusched jobs' recent utilizations, plus 100 (`NEW_JOB_UTIL`) for each gpusched job
   that has not used the GPU yet, including those this plan places: a job that is
   still loading its data has not shown what it will use, as it has not yet allocated
   its memory (rule 1 holds its declaration meanwhile). Without MPS, processes on
   one GPU take turns, so a job added to a saturated card slows the others as much as
   it gains, and ties itself to that card; waiting keeps it free to take whichever
   card frees up first, which shortens the queue's tail (docs/benchmarks.md, packing).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.units import format_size
from gpusched.scheduling.gpu_budget import (
    NEW_JOB_UTIL,
    GpuBudget,
    GpuSlot,
    PlanGpu,
    RunningClaim,
    budget_table,
    by_room,
    could_ever_fit,
    fits,
    is_open,
)
from gpusched.scheduling.gpu_choice import choose_gpus, one_node


@dataclass(frozen=True)
class WaitingJob:
    """A job that may start now (held jobs and unmet dependencies are filtered out before)."""

    job_id: int
    mem_bytes: int | None  # per GPU; None = a whole GPU
    gpu_count: int = 1
    priority: int = 0
    user: str = ""
    array_id: int | None = None
    array_cap: int | None = None  # --max-concurrent of its array
    queue_order: int | None = None  # its place in submit order; None: job_id (see _place)
    gpu_keys: frozenset[str] | None = None  # the GPUs (slot uuids) it may use; None: any


@dataclass(frozen=True)
class UserCap:
    """A user's share of the server (None: no limit)."""

    max_running: int | None = None
    max_mem_bytes: int | None = None  # declared GPU memory in use, summed over GPUs


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    placements: list[Placement]
    waiting_reasons: dict[int, str]
    budgets: dict[str, GpuBudget]


def _claim_order(job: WaitingJob) -> Callable[[PlanGpu], tuple[bool, int, int]]:
    """Rule 5's preference: cards with no job newer than `job` first, then by room."""

    def key(gpu: PlanGpu) -> tuple[bool, int, int]:
        return (any(other > job.job_id for other in gpu.job_ids), *by_room(gpu))

    return key


def _place(job: WaitingJob) -> int:
    """A job's place in submit order: its id, except that an OOM retry (a new job) keeps
    the place of its first attempt (`queue_order`), so retrying never sends it to the back."""
    return job.job_id if job.queue_order is None else job.queue_order


def _need(job: WaitingJob) -> str:
    if job.mem_bytes is None:
        return "a whole GPU" if job.gpu_count == 1 else f"{job.gpu_count} whole GPUs"
    size = format_size(job.mem_bytes)
    if job.gpu_count == 1:
        return f"{size} on 1 GPU"
    return f"{size} on each of {job.gpu_count} GPUs"


@dataclass(frozen=True)
class _Claims:
    """What the waiting reasons need to know of the cards kept for a blocked job (rule 5);
    it changes only when a job claims cards, so it is built once per claim, not per job."""

    usable_count: int
    free: list[PlanGpu]  # usable and kept for nobody
    behind: str  # "; GPUs kept for job N ahead of it", or ""

    @classmethod
    def of(cls, gpus: list[PlanGpu], claimed_by: dict[str, int]) -> _Claims:
        usable = [g for g in gpus if g.slot.usable]
        free = [g for g in usable if g.slot.uuid not in claimed_by]
        held = sorted({claimed_by[g.slot.uuid] for g in usable if g.slot.uuid in claimed_by})
        behind = f"; GPUs kept for job {', '.join(map(str, held))} ahead of it" if held else ""
        return cls(len(usable), free, behind)


def _why_not(job: WaitingJob, claims: _Claims, busy_util: float | None) -> str:
    if claims.usable_count < job.gpu_count:
        return f"needs {job.gpu_count} GPUs, {claims.usable_count} usable"
    free, behind = claims.free, claims.behind
    if busy_util is not None:
        busy = [g for g in free if fits(g, job.mem_bytes, None) and g.load >= busy_util]
        if busy:
            loads = ", ".join(f"GPU {g.slot.index} at {g.load:.0f} %" for g in busy)
            return (
                f"needs {_need(job)}; the GPUs with room for it are busy"
                f" (compute load {loads}; busy_util {busy_util:g} %){behind}"
            )
    if job.mem_bytes is None:
        return f"needs {_need(job)}; every usable GPU runs gpusched jobs{behind}"
    if not free:
        return f"needs {_need(job)}{behind}"
    best = free[0]
    for gpu in free:  # the most available, ties to the lowest index
        if gpu.available > best.available or (
            gpu.available == best.available and gpu.slot.index < best.slot.index
        ):
            best = gpu
    return (
        f"needs {_need(job)}, most available is {format_size(best.available)}"
        f" on GPU {best.slot.index}{behind}"
    )


def _claimed_bytes(mem_bytes: int | None, gpus: Sequence[PlanGpu]) -> int:
    """Declared memory a job holds over its GPUs; a whole GPU counts as its total."""
    return sum(g.slot.total_bytes if mem_bytes is None else mem_bytes for g in gpus)


def _over_mem_cap(
    job: WaitingJob, cap: UserCap | None, held_bytes: int, chosen: Sequence[PlanGpu]
) -> str | None:
    if cap is None or cap.max_mem_bytes is None:
        return None
    wanted = _claimed_bytes(job.mem_bytes, chosen)
    if held_bytes + wanted <= cap.max_mem_bytes:
        return None
    return (
        f"user limit: {job.user} holds {format_size(held_bytes)} of GPU memory and this job"
        f" needs {format_size(wanted)} (max_mem {format_size(cap.max_mem_bytes)})"
    )


@dataclass(frozen=True)
class UsageSpan:
    """A job's hold on GPU memory over time, for fair share (seconds since any epoch)."""

    user: str
    bytes_held: int  # declared memory summed over its GPUs
    start_s: float
    end_s: float | None  # None: still running


def decayed_usage(spans: Sequence[UsageSpan], now_s: float, half_life_s: float) -> dict[str, float]:
    """Each user's GPU memory-time, every instant weighted by 2^-(age / half_life).

    The integral of bytes * 2^-((now - t)/h) from start to end, in closed form, so the
    figure is derived from the job rows alone and survives a daemon restart.
    """
    scale = half_life_s / math.log(2)
    usage: dict[str, float] = {}
    for span in spans:
        end = now_s if span.end_s is None else min(span.end_s, now_s)
        start = min(span.start_s, end)
        weight = 2 ** (-(now_s - end) / half_life_s) - 2 ** (-(now_s - start) / half_life_s)
        usage[span.user] = usage.get(span.user, 0.0) + span.bytes_held * scale * weight
    return usage


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
) -> Plan:
    """Decide which waiting jobs start now and where. Pure: same input, same output."""
    table = budget_table(gpus, running, headroom_bytes)
    budgets = {uuid: budget for uuid, (budget, _) in table.items()}
    state = [gpu for _, gpu in table.values()]
    claimed_by: dict[str, int] = {}
    placements: list[Placement] = []
    reasons: dict[int, str] = {}
    caps = user_caps or {}
    by_uuid = {gpu.slot.uuid: gpu for gpu in state}
    user_running: dict[str, int] = {}
    user_bytes: dict[str, int] = {}
    for claim in running:
        user_running[claim.user] = user_running.get(claim.user, 0) + 1
        on = [by_uuid[u] for u in claim.gpu_uuids if u in by_uuid]
        user_bytes[claim.user] = user_bytes.get(claim.user, 0) + _claimed_bytes(claim.mem_bytes, on)
    array_running: dict[int, int] = {}
    for claim in running:
        if claim.array_id is not None:
            array_running[claim.array_id] = array_running.get(claim.array_id, 0) + 1
    usage = user_usage or {}
    # Jobs that ask for the same memory get the same answer until a placement or a claim
    # changes the GPUs: memoised, a pass over 10,000 waiting jobs stays cheap.
    room: list[PlanGpu] | None = None  # GPUs open to a new job, most available first
    claims: _Claims | None = None  # for waiting reasons; None: build it when next needed
    fits_by_mem: dict[int | None, list[PlanGpu]] = {}
    why_by_need: dict[tuple[int | None, int, frozenset[str] | None], str] = {}
    several_nodes = len({gpu.node for gpu in gpus}) > 1

    for job in sorted(waiting, key=lambda j: (usage.get(j.user, 0.0), -j.priority, _place(j))):
        if job.array_id is not None and job.array_cap is not None:
            in_array = array_running.get(job.array_id, 0)
            if in_array >= job.array_cap:
                reasons[job.job_id] = (
                    f"array limit: {in_array} of array a{job.array_id} running"
                    f" (--max-concurrent {job.array_cap})"
                )
                continue
        cap = caps.get(job.user)
        count = user_running.get(job.user, 0)
        if cap is not None and cap.max_running is not None and count >= cap.max_running:
            reasons[job.job_id] = (
                f"user limit: {job.user} has {count} running (max_running {cap.max_running})"
            )
            continue
        if room is None:
            room = sorted(
                (
                    g
                    for g in state
                    if g.slot.uuid not in claimed_by and is_open(g, max_jobs_per_gpu, busy_util)
                ),
                key=by_room,
            )
        chosen = choose_gpus(job, room, fits_by_mem, several_nodes)
        if chosen is not None:
            over = _over_mem_cap(job, cap, user_bytes.get(job.user, 0), chosen)
            if over is not None:
                reasons[job.job_id] = over
                continue
            user_running[job.user] = user_running.get(job.user, 0) + 1
            user_bytes[job.user] = user_bytes.get(job.user, 0) + _claimed_bytes(
                job.mem_bytes, chosen
            )
            for gpu in chosen:
                room.remove(gpu)
                gpu.job_count += 1
                gpu.job_ids.append(job.job_id)
                gpu.load += NEW_JOB_UTIL
                if job.mem_bytes is None:
                    gpu.whole = True
                    gpu.available = 0
                else:
                    gpu.available -= job.mem_bytes
                # Only the chosen GPUs changed: each goes back to its new place, if any
                # (a sort of all of them after every placement was most of a long pass).
                if is_open(gpu, max_jobs_per_gpu, busy_util):
                    bisect.insort(room, gpu, key=by_room)
            if job.array_id is not None:
                array_running[job.array_id] = array_running.get(job.array_id, 0) + 1
            placements.append(Placement(job.job_id, tuple(g.slot.uuid for g in chosen)))
            fits_by_mem.clear()
            why_by_need.clear()
            continue
        need = (job.mem_bytes, job.gpu_count, job.gpu_keys)
        if need not in why_by_need:
            if claims is None:
                claims = _Claims.of(state, claimed_by)
            why_by_need[need] = _why_not(job, claims, busy_util)
        reasons[job.job_id] = why_by_need[need]
        if not claimed_by:
            hopeful = sorted(
                (
                    g
                    for g in state
                    if could_ever_fit(g, job.mem_bytes)
                    and (job.gpu_keys is None or g.slot.uuid in job.gpu_keys)
                ),
                key=_claim_order(job),
            )
            if several_nodes and job.gpu_count > 1:
                hopeful = one_node(hopeful, job.gpu_count) or []
            # A job its owner's cap holds back would not start on drained cards either.
            over = _over_mem_cap(job, cap, user_bytes.get(job.user, 0), hopeful[: job.gpu_count])
            if over is not None:
                reasons[job.job_id] = over
            elif len(hopeful) >= job.gpu_count:
                for gpu in hopeful[: job.gpu_count]:
                    claimed_by[gpu.slot.uuid] = job.job_id
                room = None
                claims = None
                fits_by_mem.clear()
                why_by_need.clear()
            else:
                reasons[job.job_id] += " (no GPU can hold it even when gpusched's jobs end)"
    return Plan(placements, reasons, budgets)
