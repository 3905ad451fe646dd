"""The policy's plain inputs made from the scheduler's readings (models → policy types).

The policy (package `policy`) stays pure and knows nothing of `Job` or `GpuState`; these
conversions are the scheduler's side of that boundary, used by every tick and by `status`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gpusched.core.models import GpuHealth, GpuState, Job
from gpusched.scheduling.policy import GpuSlot, HeadClaim, RunningClaim, WaitingJob
from gpusched.store import HeadClaims, Queued, StoredClaim
from gpusched.usage.attribution import Outsider
from gpusched.usage.monitor import UsageMonitor


def capacity_bytes(gpu: GpuState) -> int:
    """What jobs could ever use on a GPU: its total less what the driver keeps for itself.

    NVML's v2 memory call leaves driver-reserved memory out of both used and free, so it
    is the gap between used + free and the total; a lost GPU reads 0 and 0.
    """
    seen = gpu.used_bytes + gpu.free_bytes
    return seen if seen > 0 else gpu.total_bytes


def gpu_slot(gpu: GpuState, util: float | None = None, other: Outsider | None = None) -> GpuSlot:
    """`other`: the largest process on it gpusched did not start (the reasons name it)."""
    outsider = None
    if other is not None:
        owner = other.user or ("unknown" if other.uid is None else f"uid {other.uid}")
        outsider = (other.pid, owner, other.all_bytes)
    return GpuSlot(
        gpu.uuid,
        gpu.index,
        gpu.total_bytes,
        gpu.free_bytes,
        usable=gpu.health == GpuHealth.OK,
        util_percent=util,
        outsider=outsider,
    )


def running_claim(
    job: Job,
    usage: dict[int, dict[str, int]],
    util: float | None = None,
    *,
    now: datetime | None = None,
    demand: float | None = None,
    peak_bytes: int | None = None,
) -> RunningClaim:
    """`now`: to know what is left of its --time (the head's claim, time backfill)."""
    return RunningClaim(
        job.id,
        tuple(job.gpu_uuids),
        job.mem,
        usage.get(job.id, {}),
        job.user,
        job.array_id,
        util_percent=util,
        demand=demand,
        ends_in_s=time_left(job, now),
        exclusive=job.exclusive,
        # An interactive job is light until its own polls say otherwise, as --share is.
        share=job.share or job.interactive,
        peak_bytes=max(job.peak_mem or 0, peak_bytes or 0),
        ram_bytes=job.ram,
        cpus=job.cpus,
    )


def time_left(job: Job, now: datetime | None) -> float | None:
    """Seconds left of a running job's --time (0 when past it); None: no limit."""
    if job.time_limit_s is None or job.started_at is None or now is None:
        return None
    ran = now.timestamp() - epoch_seconds(job.started_at)
    return max(0.0, job.time_limit_s - ran)


def running_demand(monitor: UsageMonitor, job: Job) -> float | None:
    """A running job's GPU demand (0.0-1.0 of a card's busy time) for the policy's rule 3:
    as measured (gpusched.usage.demand: its own share apart from its neighbours'), by this
    daemon or, for a job on another node of a cluster, as last stored; until it is known,
    what its history says (`expected_demand`). None: not known."""
    measured = monitor.job_demand(job.id)
    if measured is None:
        measured = job.demand
    return measured if measured is not None else monitor.expected_demand(job)


def running_claims(
    running: Sequence[Job],
    usage: dict[int, dict[str, int]],
    util_of: Callable[[int], float | None],
    now: datetime,
    *,
    peak_of: Callable[[int], int | None] = lambda job_id: None,
    demand_of: Callable[[Job], float | None] = lambda job: None,
) -> list[RunningClaim]:
    """The running jobs as the policy sees them, each with its demand (`running_demand`)."""
    claims = []
    for job in running:
        util = util_of(job.id)
        demand = demand_of(job)
        peak = peak_of(job.id)
        claims.append(running_claim(job, usage, util, now=now, demand=demand, peak_bytes=peak))
    return claims


def epoch_seconds(moment: str | None) -> float:
    return datetime.fromisoformat(moment).timestamp() if moment else 0.0


def waiting_job(job: Queued, now: datetime | None = None) -> WaitingJob:
    """The policy's view of a queued job; its expected demand and how long it has waited
    for a quieter card are the pass's to add (pass_rules.decide). `now`: unused, kept
    for the placers' restrictions."""
    return WaitingJob(
        job.id,
        job.mem,
        job.gpus,
        job.priority,
        job.user,
        job.array_id,
        job.max_concurrent,
        queue_order=job.retry_of,  # an OOM retry keeps its first attempt's place
        exclusive=bool(job.exclusive),
        # An interactive job is light until what was measured of its kind says otherwise.
        share=bool(job.share or job.interactive),
        time_limit_s=job.time_limit_s,
        top=job.top,
        ram_bytes=job.ram,
        cpus=job.cpus,
    )


class WaitingJobs:
    """Each queued job's `WaitingJob`, built once and kept between passes while the store
    hands back the same `Queued` (it does while the job's row is unchanged: store
    `queued_of`); a changed row is a new `Queued`, and its view is built again. Kept by
    a placer; `anywhere` is its restriction for pass_rules.decide (one server: any GPU).
    Only the views of the jobs the last pass asked for are kept."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[Queued, WaitingJob]] = {}
        self._this: dict[int, tuple[Queued, WaitingJob]] = {}
        self._views_of: tuple[Queued, ...] = ()  # the jobs `views` last answered for
        self._views: tuple[WaitingJob, ...] = ()

    def new_pass(self) -> None:
        """Forget the views no pass since the one before has asked for."""
        self._last, self._this = self._this or self._last, {}

    def anywhere(self, job: Queued, now: datetime) -> tuple[WaitingJob | None, str | None]:
        return self._view(job, now), None

    def views(self, jobs: Sequence[Queued], now: datetime) -> tuple[WaitingJob, ...]:
        """`anywhere`'s view of each of `jobs`, in order. When the store handed back the
        very same `Queued`s as last time (a queue that did not change), last time's very
        tuple (what a pass derives from it is kept: scheduling.last_answer): a long
        unchanged queue costs one comparison, not a look-up per job.
        (The views stay known to `anywhere`: `new_pass` keeps the last pass's that asked.)"""
        if jobs is self._views_of:  # the store's very tuple: an unchanged queue
            return self._views
        given = tuple(jobs)
        # Compared item by item by identity first (a C loop): an equal row, if not the
        # same object, has an equal view anyway.
        if given != self._views_of:
            self._views = tuple(self._view(job, now) for job in given)
        self._views_of = jobs if isinstance(jobs, tuple) else given
        return self._views

    def _view(self, job: Queued, now: datetime) -> WaitingJob:
        known = self._this.get(job.id) or self._last.get(job.id)
        if known is None or known[0] is not job:
            known = (job, waiting_job(job, now))
        self._this[job.id] = known
        return known[1]


class StoredHeadClaim:
    """The head's claim between passes: read from the store once, written when it changes
    (so it survives a restart, and a pass that keeps it writes nothing)."""

    def __init__(self, claims: HeadClaims) -> None:
        self._claims = claims
        self._claim: HeadClaim | None = None
        self._read = False

    def get(self) -> HeadClaim | None:
        if not self._read:
            stored = self._claims.current()
            if stored is not None:
                self._claim = HeadClaim(stored.job_id, stored.gpu_uuids, stored.mem)
            self._read = True
        return self._claim

    def keep(self, claim: HeadClaim | None) -> None:
        if claim == self.get():
            return
        stored = (
            None if claim is None else StoredClaim(claim.job_id, claim.gpu_uuids, claim.mem_bytes)
        )
        self._claims.keep(stored)
        self._claim = claim


def gpu_topology(probe: object) -> dict[str, dict[str, int]] | None:
    """The probe's GPU topology (NVML common-ancestor levels by uuid), when it reads one:
    `topology()` is optional (NvmlProbe and SimulatedProbe have it); None: unknown."""
    read = getattr(probe, "topology", None)
    if read is None:
        return None
    levels = read()
    return levels or None
