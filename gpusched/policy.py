"""The scheduling policy: a pure function from a snapshot to placements.

`plan()` takes plain data (GPUs as read now, the claims of running jobs, the jobs
that may start) and returns plain data (which job goes where, and why each other job
waits). No I/O, no clock, no randomness: tests drive it with hypothesis and the
benchmarks call it in a loop.

The rules, in order:

1. A GPU's available memory is what NVML says is free, minus the headroom, minus for
   each running gpusched job on it max(0, declared - what the job's processes use now).
   A job that has launched but not yet allocated still holds its whole claim; memory
   held by processes gpusched did not start is respected because NVML counts it.
   A GPU that runs a whole-GPU job (no --mem) has nothing available. Lost and
   excluded GPUs have nothing available.
2. Waiting jobs are taken by priority (higher first), then submit order.
3. A job starts on the N GPUs with the most available memory among those where it
   fits (each needs `mem` available, or no gpusched job at all for a whole-GPU job,
   and fewer than `max_jobs_per_gpu` jobs).
4. Per-user caps (`limits:` in the config): a job that would take its user past
   `max_running` jobs or `max_mem` of declared GPU memory (a whole GPU counts as its
   total) waits, and says which limit; it claims no GPU, since it waits for its owner's
   own jobs, not for room.
5. Anti-starvation ("the head keeps its cards"): the first job in that order that
   cannot start claims the N GPUs on which it could fit once gpusched's running jobs
   end (preferring those with the most available now). No job behind it may start
   on a claimed GPU, so those cards drain and the blocked job starts as soon as its
   claimed GPUs have room. Jobs behind it may still start on unclaimed GPUs, which is
   how small jobs pass a big one without ever delaying it. A job that could not fit
   even on empty GPUs (other processes hold the memory) claims nothing: holding cards
   for it would idle them for a wait gpusched cannot end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpusched.units import format_size


@dataclass(frozen=True)
class GpuSlot:
    """A GPU as the policy sees it."""

    uuid: str
    index: int
    total_bytes: int
    free_bytes: int  # as the driver reports it: every process's memory is already out
    usable: bool = True  # False when lost or excluded


@dataclass(frozen=True)
class RunningClaim:
    """A running gpusched job's hold on its GPUs."""

    job_id: int
    gpu_uuids: tuple[str, ...]
    mem_bytes: int | None  # declared per GPU; None = the whole GPU
    used_bytes: Mapping[str, int] = field(default_factory=dict)  # observed, per GPU uuid
    user: str = ""


@dataclass(frozen=True)
class WaitingJob:
    """A job that may start now (held jobs and unmet dependencies are filtered out before)."""

    job_id: int
    mem_bytes: int | None  # per GPU; None = a whole GPU
    gpu_count: int = 1
    priority: int = 0
    user: str = ""


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
class GpuBudget:
    """What a GPU holds for gpusched before this plan's placements."""

    reserved_bytes: int  # claimed by running jobs beyond what they use yet
    available_bytes: int  # what the next job could get
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    placements: list[Placement]
    waiting_reasons: dict[int, str]
    budgets: dict[str, GpuBudget]


@dataclass
class _Gpu:
    slot: GpuSlot
    available: int
    potential: int  # available once every gpusched job on it has ended
    job_count: int
    whole: bool  # a whole-GPU job runs here


def gpu_budgets(
    gpus: Sequence[GpuSlot], running: Sequence[RunningClaim], headroom_bytes: int
) -> dict[str, GpuBudget]:
    """Rule 1 alone: reserved and available memory per GPU (what `status` shows)."""
    return {uuid: budget for uuid, (budget, _) in _budgets(gpus, running, headroom_bytes).items()}


def _budgets(
    gpus: Sequence[GpuSlot], running: Sequence[RunningClaim], headroom_bytes: int
) -> dict[str, tuple[GpuBudget, _Gpu]]:
    result: dict[str, tuple[GpuBudget, _Gpu]] = {}
    for slot in gpus:
        on_gpu = [claim for claim in running if slot.uuid in claim.gpu_uuids]
        used_by_jobs = sum(claim.used_bytes.get(slot.uuid, 0) for claim in on_gpu)
        reserved = sum(
            max(0, claim.mem_bytes - claim.used_bytes.get(slot.uuid, 0))
            for claim in on_gpu
            if claim.mem_bytes is not None
        )
        whole = any(claim.mem_bytes is None for claim in on_gpu)
        if whole:
            reserved = max(0, slot.free_bytes - headroom_bytes)  # all of what is left is theirs
        available = max(0, slot.free_bytes - headroom_bytes - reserved)
        if whole or not slot.usable:
            available = 0
        used_by_others = max(0, slot.total_bytes - slot.free_bytes - used_by_jobs)
        potential = max(0, slot.total_bytes - headroom_bytes - used_by_others) if slot.usable else 0
        budget = GpuBudget(reserved, available, tuple(claim.job_id for claim in on_gpu))
        result[slot.uuid] = (budget, _Gpu(slot, available, potential, len(on_gpu), whole))
    return result


def _fits(gpu: _Gpu, job: WaitingJob, max_jobs_per_gpu: int | None) -> bool:
    if not gpu.slot.usable or gpu.whole:
        return False
    if max_jobs_per_gpu is not None and gpu.job_count >= max_jobs_per_gpu:
        return False
    if job.mem_bytes is None:
        return gpu.job_count == 0
    return gpu.available >= job.mem_bytes


def _could_ever_fit(gpu: _Gpu, job: WaitingJob) -> bool:
    if not gpu.slot.usable:
        return False
    return job.mem_bytes is None or gpu.potential >= job.mem_bytes


def _by_room(gpu: _Gpu) -> tuple[int, int]:
    return (-gpu.available, gpu.slot.index)


def _need(job: WaitingJob) -> str:
    if job.mem_bytes is None:
        return "a whole GPU" if job.gpu_count == 1 else f"{job.gpu_count} whole GPUs"
    size = format_size(job.mem_bytes)
    if job.gpu_count == 1:
        return f"{size} on 1 GPU"
    return f"{size} on each of {job.gpu_count} GPUs"


def _why_not(job: WaitingJob, gpus: list[_Gpu], claimed_by: dict[str, int]) -> str:
    usable = [g for g in gpus if g.slot.usable]
    if len(usable) < job.gpu_count:
        return f"needs {job.gpu_count} GPUs, {len(usable)} usable"
    free = [g for g in usable if g.slot.uuid not in claimed_by]
    held = sorted({claimed_by[g.slot.uuid] for g in usable if g.slot.uuid in claimed_by})
    behind = f"; GPUs kept for job {', '.join(map(str, held))} ahead of it" if held else ""
    if job.mem_bytes is None:
        return f"needs {_need(job)}; every usable GPU runs gpusched jobs{behind}"
    best = max(free, key=lambda g: (g.available, -g.slot.index), default=None)
    if best is None:
        return f"needs {_need(job)}{behind}"
    return (
        f"needs {_need(job)}, most available is {format_size(best.available)}"
        f" on GPU {best.slot.index}{behind}"
    )


def _claimed_bytes(mem_bytes: int | None, gpus: Sequence[_Gpu]) -> int:
    """Declared memory a job holds over its GPUs; a whole GPU counts as its total."""
    return sum(g.slot.total_bytes if mem_bytes is None else mem_bytes for g in gpus)


def _over_mem_cap(
    job: WaitingJob, cap: UserCap | None, held_bytes: int, chosen: Sequence[_Gpu]
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


def plan(
    gpus: Sequence[GpuSlot],
    running: Sequence[RunningClaim],
    waiting: Sequence[WaitingJob],
    headroom_bytes: int = 0,
    max_jobs_per_gpu: int | None = None,
    *,
    user_caps: Mapping[str, UserCap] | None = None,
) -> Plan:
    """Decide which waiting jobs start now and where. Pure: same input, same output."""
    table = _budgets(gpus, running, headroom_bytes)
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

    for job in sorted(waiting, key=lambda j: (-j.priority, j.job_id)):
        cap = caps.get(job.user)
        count = user_running.get(job.user, 0)
        if cap is not None and cap.max_running is not None and count >= cap.max_running:
            reasons[job.job_id] = (
                f"user limit: {job.user} has {count} running (max_running {cap.max_running})"
            )
            continue
        open_gpus = [g for g in state if g.slot.uuid not in claimed_by]
        candidates = sorted((g for g in open_gpus if _fits(g, job, max_jobs_per_gpu)), key=_by_room)
        if len(candidates) >= job.gpu_count:
            chosen = candidates[: job.gpu_count]
            over = _over_mem_cap(job, cap, user_bytes.get(job.user, 0), chosen)
            if over is not None:
                reasons[job.job_id] = over
                continue
            user_running[job.user] = user_running.get(job.user, 0) + 1
            user_bytes[job.user] = user_bytes.get(job.user, 0) + _claimed_bytes(
                job.mem_bytes, chosen
            )
            for gpu in chosen:
                gpu.job_count += 1
                if job.mem_bytes is None:
                    gpu.whole = True
                    gpu.available = 0
                else:
                    gpu.available -= job.mem_bytes
            placements.append(Placement(job.job_id, tuple(g.slot.uuid for g in chosen)))
            continue
        reasons[job.job_id] = _why_not(job, state, claimed_by)
        if not claimed_by:
            hopeful = sorted((g for g in open_gpus if _could_ever_fit(g, job)), key=_by_room)
            if len(hopeful) >= job.gpu_count:
                for gpu in hopeful[: job.gpu_count]:
                    claimed_by[gpu.slot.uuid] = job.job_id
            else:
                reasons[job.job_id] += " (no GPU can hold it even when gpusched's jobs end)"
    return Plan(placements, reasons, budgets)
