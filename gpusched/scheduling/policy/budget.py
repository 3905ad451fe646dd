"""What each GPU holds for gpusched and has left, before a plan places anything.

Memory: a GPU's available memory is what the driver says is free, minus the headroom,
minus what running gpusched jobs have declared (or were seen to peak at, if more) but do
not hold now; a GPU running a whole-GPU job, lost or excluded has none. Compute: a GPU's
load is the higher of its own recent utilization and its jobs' sum, plus `NEW_JOB_UTIL`
per job not measured yet (what `busy_util` compares, rule module card_limits). Demand:
each job's share of a card's busy time as the contention rule counts it.
`gpu_budgets` is the memory alone (what `status` shows); `budget_table` also gives the
working state (`PlanGpu`) that a plan places jobs on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSlot:
    """A GPU as the policy sees it."""

    uuid: str
    index: int
    total_bytes: int
    free_bytes: int  # as the driver reports it: every process's memory is already out
    usable: bool = True  # False when lost or excluded
    util_percent: float | None = None  # recent compute utilization, every process's; None: unknown
    node: str = ""  # the server it is on: a job's GPUs are all on one (cluster)
    # The largest process on it gpusched did not start, for the reasons: (its pid, its
    # owner, what all such processes hold); None: none, or not known.
    outsider: tuple[int, str, int] | None = None


@dataclass(frozen=True)
class RunningClaim:
    """A running gpusched job's hold on its GPUs."""

    job_id: int
    gpu_uuids: tuple[str, ...]
    mem_bytes: int | None  # declared per GPU; None = the whole GPU
    used_bytes: Mapping[str, int] = field(default_factory=dict)  # observed, per GPU uuid
    user: str = ""
    array_id: int | None = None
    util_percent: float | None = None  # its own recent utilization; None: not measured yet
    # Share of a card's busy time it needs, 0.0-1.0 (contention); None: not known yet.
    demand: float | None = None
    ends_in_s: float | None = None  # what is left of its --time; None: no limit
    exclusive: bool = False  # --exclusive: its cards take no other job
    share: bool = False  # --share: light (no demand) until a measurement says otherwise
    peak_bytes: int = 0  # the most it was seen holding on one GPU: reserved like --mem
    ram_bytes: int | None = None  # --ram: host memory it reserves (the host rule)
    cpus: int | None = None  # --cpus: cores it reserves


@dataclass(frozen=True)
class GpuBudget:
    """What a GPU holds for gpusched before this plan's placements."""

    reserved_bytes: int  # claimed by running jobs beyond what they use yet
    available_bytes: int  # what the next job could get
    job_ids: tuple[int, ...]
    short_bytes: int = 0  # reservations the card's free memory cannot cover now


# What a job that has not used its GPU yet counts for in a card's load, in percent.
NEW_JOB_UTIL = 100.0


@dataclass
class PlanGpu:
    """A GPU as one plan works on it: its room changes as the plan places jobs."""

    slot: GpuSlot
    available: int
    potential: int  # available once every gpusched job on it has ended
    job_count: int
    whole: bool  # a whole-GPU job runs here
    job_ids: list[int]  # gpusched jobs on it, running or placed by this plan
    load: float  # compute load, percent of the GPU (card_limits' busy_util)
    # Each running job's hold: (job id, memory it frees when it ends (None: a whole GPU),
    # seconds left of its --time (None: no limit)). What a blocked head waits for.
    holds: list[tuple[int, int | None, float | None]] = field(default_factory=list)
    demand: float = 0.0  # its jobs' summed demand (unknown counts as 1.0): contention
    busy_with: list[int] = field(default_factory=list)  # its jobs known or assumed busy
    exclusive: bool = False  # an --exclusive job runs here: nothing joins it
    measured: float = 0.0  # the part of `demand` that is known (not an unknown's 1.0)


def gpu_budgets(
    gpus: Sequence[GpuSlot], running: Sequence[RunningClaim], headroom_bytes: int
) -> dict[str, GpuBudget]:
    """Memory alone: reserved and available memory per GPU (what `status` shows)."""
    table = budget_table(gpus, running, headroom_bytes)
    return {uuid: budget for uuid, (budget, _) in table.items()}


def budget_table(
    gpus: Sequence[GpuSlot], running: Sequence[RunningClaim], headroom_bytes: int
) -> dict[str, tuple[GpuBudget, PlanGpu]]:
    """Each GPU's budget and the state a plan starts from (its load and demand too)."""
    result: dict[str, tuple[GpuBudget, PlanGpu]] = {}
    for slot in gpus:
        on_gpu = [claim for claim in running if slot.uuid in claim.gpu_uuids]
        used_by_jobs = sum(claim.used_bytes.get(slot.uuid, 0) for claim in on_gpu)
        # A job reserves max(declared, peak seen): one that once used more may again.
        reserved = sum(
            max(0, max(claim.mem_bytes, claim.peak_bytes) - claim.used_bytes.get(slot.uuid, 0))
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
        # Promised to its jobs but no longer free (another process or a job took it).
        short = 0 if whole or not slot.usable else max(0, reserved - slot.free_bytes)
        budget = GpuBudget(reserved, available, tuple(claim.job_id for claim in on_gpu), short)
        job_ids = [claim.job_id for claim in on_gpu]
        load = compute_load(slot, on_gpu)
        holds = [
            (
                claim.job_id,
                None
                if claim.mem_bytes is None
                else max(claim.mem_bytes, claim.peak_bytes, claim.used_bytes.get(slot.uuid, 0)),
                claim.ends_in_s,
            )
            for claim in on_gpu
        ]
        gpu = PlanGpu(
            slot,
            available,
            potential,
            len(on_gpu),
            whole,
            job_ids,
            load,
            holds,
            sum(job_demand(c.demand, c.share) for c in on_gpu),
            [c.job_id for c in on_gpu if job_demand(c.demand, c.share) >= BUSY_DEMAND],
            any(c.exclusive for c in on_gpu),
            sum(known_demand(c.demand, c.share) for c in on_gpu),
        )
        result[slot.uuid] = (budget, gpu)
    return result


# Contention: a job needing at least this share of a card's time is "busy" (two such jobs on
# one card each run at about half speed: docs/benchmarks.md, FIELD.md's measured table).
BUSY_DEMAND = 0.5


def job_demand(demand: float | None, share: bool) -> float:
    """A job's demand as contention counts it: what was measured of it (or of its kind),
    whatever `--share` says; else --share is light and an unknown one busy."""
    if demand is None:
        return 0.0 if share else 1.0
    return min(1.0, max(0.0, demand))


def known_demand(demand: float | None, share: bool) -> float:
    """A job's demand as far as it is known: an unknown one counts for nothing here."""
    return 0.0 if demand is None else min(1.0, max(0.0, demand))


def compute_load(slot: GpuSlot, on_gpu: Sequence[RunningClaim]) -> float:
    """A GPU's compute load in percent (may pass 100 when it is oversubscribed)."""
    known = sum(c.util_percent for c in on_gpu if c.util_percent is not None)
    unmeasured = sum(1 for c in on_gpu if c.util_percent is None)
    # The GPU's own reading also counts processes gpusched did not start.
    return max(slot.util_percent or 0.0, known) + NEW_JOB_UTIL * unmeasured


def could_ever_fit(gpu: PlanGpu, mem_bytes: int | None) -> bool:
    """Whether it could, once every gpusched job on the GPU has ended."""
    if not gpu.slot.usable:
        return False
    return mem_bytes is None or gpu.potential >= mem_bytes


def by_room(gpu: PlanGpu) -> tuple[int, int]:
    return (-gpu.available, gpu.slot.index)
