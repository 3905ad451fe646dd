"""The rules of every pass, whichever placer runs it (one server's, or the cluster's
elected scheduler): ONE function, `decide`, so that a rule added here applies to both.

In order: which queued jobs may be planned by their dependencies (admission), the
interactive cap (`interactive.max_per_user`), an administrator's drain, the placer's own
restriction (in a cluster: the nodes a job may run on), then the policy's `plan()` with
each user's caps and fair share. The placer builds the GPU slots and the claims on them
(policy_inputs, cluster.inputs), ends the jobs whose dependency failed (the `Decision`
names them) and acts on the plan. `decide` writes no job's row; it keeps only the head's
claim in the store (policy rule 1) and the placer's record of the jobs held for a
quieter card (`QuieterWaits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from gpusched.config.settings import Config
from gpusched.core.models import GpuState, Job
from gpusched.scheduling.admission import Admission, DependencyFailed, admit
from gpusched.scheduling.context import Context
from gpusched.scheduling.fair_share import recent_usage
from gpusched.scheduling.interactive import hold_back_interactive
from gpusched.scheduling.last_answer import LastAnswer
from gpusched.scheduling.policy import (
    GpuSlot,
    HostRoom,
    Plan,
    RunningClaim,
    UserCap,
    WaitingJob,
    plan,
)
from gpusched.scheduling.policy_inputs import StoredHeadClaim, waiting_job
from gpusched.scheduling.quieter_waits import QuieterWaits
from gpusched.store import Queued
from gpusched.usage.demand_history import DemandHistory

# A queued job as the plan sees it (at this pass's time), or why it may go nowhere in it.
Restriction = Callable[[Queued, datetime], tuple[WaitingJob | None, str | None]]


_user = attrgetter("user")
# The users of the eligible jobs last asked about (scheduling.last_answer).
_waiting_users: LastAnswer[Queued, frozenset[str]] = LastAnswer(lambda q: frozenset(map(_user, q)))


def anywhere(job: Queued, now: datetime) -> tuple[WaitingJob | None, str | None]:
    return waiting_job(job, now), None


def expected_demand(history: DemandHistory, job: Queued) -> tuple[float | None, int]:
    """A waiting job's expected demand and, when it is its owner's, of how many of the
    owner's latest ended runs (0: its own history, or nothing known): its own history
    first (the same sweep, else --name, else command); a job with none (a new project)
    takes its owner's latest ended runs when all were busy (`DemandHistory.owner_prior`),
    unless it is `--share` or interactive (looked up among interactive runs only)."""
    return history.estimate(
        job.id,
        job.uid,
        job.array_id,
        job.name,
        job.command_json,
        share=bool(job.share),
        interactive=bool(job.interactive),
    )


def user_cap(config: Config, user: str) -> UserCap:
    limits = config.limits_for(user)
    return UserCap(limits.max_running, limits.max_mem_bytes)


# The placer's views of a whole queue at once, where every job may go anywhere.
Views = Callable[[Sequence[Queued], datetime], Sequence[WaitingJob]]


@dataclass(frozen=True)
class Decision:
    """One pass's plan, and the queued jobs that can never run because a dependency
    failed: the placer ends those (`cancelled`, `dependency_failed`) before it acts on
    the plan."""

    plan: Plan
    doomed: list[DependencyFailed]


def decide(
    context: Context,
    *,
    slots: list[GpuSlot],
    claims: list[RunningClaim],
    holding: Sequence[Job],
    gpus: Sequence[GpuState],
    waits: QuieterWaits,
    restrict: Restriction = anywhere,
    views: Views | None = None,
    held_back: str | None = None,
    topology: Mapping[str, Mapping[str, int]] | None = None,
    hosts: Mapping[str, HostRoom] | None = None,
) -> Decision:
    """One pass's plan (placements and waiting reasons) over `slots`, the GPUs a placer
    offers, of which `claims` are taken by `holding` (the jobs running, and in a cluster
    placed), and the jobs whose dependency failed, for the placer to end (`Decision`).
    `gpus`: the same GPUs as read, for fair share. `held_back`: an
    administrator's drain, said to every job that could otherwise be planned.
    `topology`: NVML's common-ancestor levels between the GPUs (by slot uuid), if known.
    `hosts`: each server's room for --ram and --cpus, by node name (the host rule).
    The head's claim (policy rule 1) is read from the store and written back when the
    plan moves it, so it is kept across passes, placers and restarts. `waits`: when each
    job was first held for a quieter card (rule 3's bound), the placer's, kept in memory.
    Under `pack: contention` each waiting job's demand is what its history says
    (`expected_demand`).
    `views`: where every job may go anywhere (one server), the placer's views of the
    whole queue at once (`WaitingJobs.views`), used when there is nothing to add to them
    (no demand history, no job held for a quieter card); `restrict` is asked otherwise."""
    config = context.config  # one pass, one config: a reload reaches the next pass
    now = context.clock()
    admitted = _admitted(context, config, holding)
    reasons = dict(admitted.waiting_reasons)
    if held_back is not None:  # "start nothing new": no plan to make
        reasons.update({job.id: held_back for job in admitted.eligible})
        return Decision(Plan([], reasons, {}), admitted.doomed)
    eligible = admitted.eligible
    waiting = _waiting(
        context, config, eligible, now, waits=waits, restrict=restrict, views=views, reasons=reasons
    )
    result = _planned(
        context,
        config,
        now,
        waiting,
        eligible,
        slots=slots,
        claims=claims,
        holding=holding,
        gpus=gpus,
        topology=topology,
        hosts=hosts,
    )
    if result.quieter or waits:
        waits.note(result.quieter, {job.id for job in eligible}, now.timestamp())
    return Decision(_with_reasons(result, reasons), admitted.doomed)


def _admitted(context: Context, config: Config, holding: Sequence[Job]) -> Admission:
    """The queued jobs that may be planned by their dependencies and the interactive cap,
    why each other waits, and those whose dependency failed."""
    jobs = context.store.jobs
    admitted = admit(jobs.queued(), jobs.latest_attempts)
    hold_back_interactive(admitted, holding, config.interactive.max_per_user)
    return admitted


def _waiting(
    context: Context,
    config: Config,
    eligible: Sequence[Queued],
    now: datetime,
    *,
    waits: QuieterWaits,
    restrict: Restriction,
    views: Views | None,
    reasons: dict[int, str],
) -> Sequence[WaitingJob]:
    """The eligible jobs as the plan sees them: the placer's `views` as kept when there is
    nothing to add to them, else each as `restrict` sees it (one it lets run nowhere gets
    its reason in `reasons`), with what the pass adds (`_additions`)."""
    added = _additions(context, config, waits, now)
    if added is None and views is not None:
        return views(eligible, now)  # nothing to add: the placer's views as kept
    return _restricted(eligible, now, restrict, reasons, added)


def _additions(
    context: Context, config: Config, waits: QuieterWaits, now: datetime
) -> _Additions | None:
    """What this pass adds to the waiting jobs' views, None if nothing: only under
    `pack: contention`, and only if a demand is known or a job is held for a quieter card."""
    if config.pack != "contention":
        return None
    history = context.monitor.demand_history()  # read at most once a minute
    # Asked once a pass, not once per job of a long queue.
    known = history if history else None
    held = bool(waits)
    if known is None and not held:
        return None
    return _Additions(known, waits if held else None, now.timestamp())


@dataclass(frozen=True)
class _Additions:
    """What a pass under `pack: contention` adds to a waiting job's view: its expected
    demand (`known`: the demand history, None when it is empty) and how long rule 3 has
    held it for a quieter card (`waits`: None when it holds none)."""

    known: DemandHistory | None
    waits: QuieterWaits | None
    now_s: float

    def to(self, job: Queued, wanted: WaitingJob) -> WaitingJob:
        known, waits = self.known, self.waits
        demand, owner_runs = expected_demand(known, job) if known is not None else (None, 0)
        waited = waits.waited_s(job.id, self.now_s) if waits is not None else 0.0
        if demand is None and not waited:
            return wanted
        return dataclasses.replace(wanted, demand=demand, owner_runs=owner_runs, waited_s=waited)


def _restricted(
    eligible: Sequence[Queued],
    now: datetime,
    restrict: Restriction,
    reasons: dict[int, str],
    added: _Additions | None,
) -> list[WaitingJob]:
    """Each eligible job as `restrict` sees it, with `added` if any; a job it lets run
    nowhere is left out, its reason in `reasons`."""
    built: list[WaitingJob] = []
    for job in eligible:
        wanted, why = restrict(job, now)
        if wanted is None:
            reasons[job.id] = why or "it may run nowhere"
            continue
        built.append(wanted if added is None else added.to(job, wanted))
    return built


def _planned(
    context: Context,
    config: Config,
    now: datetime,
    waiting: Sequence[WaitingJob],
    eligible: Sequence[Queued],
    *,
    slots: list[GpuSlot],
    claims: list[RunningClaim],
    holding: Sequence[Job],
    gpus: Sequence[GpuState],
    topology: Mapping[str, Mapping[str, int]] | None,
    hosts: Mapping[str, HostRoom] | None = None,
) -> Plan:
    """The policy's plan of `waiting` (the views of `eligible`) over `slots`, with each
    user's caps and fair share; the head's claim it moves is kept in the store."""
    waiting_users = _waiting_users(eligible)  # a C loop, once per queue
    users = set(map(_user, holding)) | waiting_users
    head = StoredHeadClaim(context.store.head_claims)
    usage = recent_usage(
        context.store.jobs, waiting_users, gpus, now, config.fair_share_half_life_s
    )
    result = plan(
        slots,
        claims,
        waiting,
        config.headroom_bytes,
        config.max_jobs_per_gpu,
        user_caps={user: user_cap(config, user) for user in users},
        user_usage=usage,
        busy_util=config.busy_util,
        head_claim=head.get(),
        topology=topology,
        placement=config.placement,
        pack=config.pack,
        hosts=hosts,
    )
    head.keep(result.head_claim)
    return result


def _with_reasons(result: Plan, reasons: dict[int, str]) -> Plan:
    """The plan with the reasons found before it (admission, the interactive cap, the
    placer's restriction) for the jobs it gives none."""
    if reasons:  # else the plan's own (a long queue's reasons are not copied)
        result.waiting_reasons.update(
            {k: v for k, v in reasons.items() if k not in result.waiting_reasons}
        )
    return Plan(result.placements, result.waiting_reasons, result.budgets)
