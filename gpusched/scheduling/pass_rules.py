"""The rules of every pass, whichever placer runs it (one server's, or the cluster's
elected scheduler): ONE function, so that a rule added here applies to both.

In order: which queued jobs may be planned by their dependencies (admission), the
interactive cap (`interactive.max_per_user`), ending the jobs whose dependency failed,
an administrator's drain, the placer's own restriction (in a cluster: the nodes a job
may run on), then the policy's `plan()` with each user's caps and fair share. The
placer builds the GPU slots and the claims on them (policy_inputs, cluster.inputs) and
acts on the plan; this function writes nothing but the doomed jobs' ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter

from gpusched.config.settings import Config
from gpusched.core.models import EndReason, GpuState, Job, JobState
from gpusched.scheduling.admission import admit
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.fair_share import recent_usage
from gpusched.scheduling.interactive import hold_back_interactive
from gpusched.scheduling.last_answer import LastAnswer
from gpusched.scheduling.policy import GpuSlot, Plan, RunningClaim, UserCap, WaitingJob, plan
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
    takes its owner's latest ended runs when all were busy (`DemandHistory.owner_prior`)."""
    return history.estimate(job.id, job.uid, job.array_id, job.name, job.command_json)


def user_cap(config: Config, user: str) -> UserCap:
    limits = config.limits_for(user)
    return UserCap(limits.max_running, limits.max_mem_bytes)


def decide(
    context: Context,
    endings: JobEndings,
    *,
    slots: list[GpuSlot],
    claims: list[RunningClaim],
    holding: Sequence[Job],
    gpus: Sequence[GpuState],
    waits: QuieterWaits,
    restrict: Restriction = anywhere,
    views: Callable[[Sequence[Queued], datetime], Sequence[WaitingJob]] | None = None,
    held_back: str | None = None,
    topology: Mapping[str, Mapping[str, int]] | None = None,
) -> Plan:
    """The placements and waiting reasons of one pass over `slots`, the GPUs a placer
    offers, of which `claims` are taken by `holding` (the jobs running, and in a cluster
    placed); `gpus`: the same GPUs as read, for fair share. `held_back`: an
    administrator's drain, said to every job that could otherwise be planned.
    `topology`: NVML's common-ancestor levels between the GPUs (by slot uuid), if known.
    The head's claim (policy rule 1) is read from the store and written back when the
    plan moves it, so it is kept across passes, placers and restarts. `waits`: when each
    job was first held for a quieter card (rule 3's bound), the placer's, kept in memory.
    Under `pack: contention` each waiting job's demand is what its history says
    (`expected_demand`).
    `views`: where every job may go anywhere (one server), the placer's views of the
    whole queue at once (`WaitingJobs.views`), used when there is nothing to add to them
    (no demand history, no job held for a quieter card); `restrict` is asked otherwise."""
    config, jobs = context.config, context.store.jobs
    now = context.clock()
    admitted = admit(jobs.queued(), jobs.latest_attempts)
    hold_back_interactive(admitted, holding, config.interactive.max_per_user)
    for doomed in admitted.doomed:
        endings.end(
            doomed.job_id, JobState.CANCELLED, EndReason.DEPENDENCY_FAILED, detail=doomed.detail
        )
    reasons = dict(admitted.waiting_reasons)
    if held_back is not None:  # "start nothing new": no plan to make
        reasons.update({job.id: held_back for job in admitted.eligible})
        return Plan([], reasons, {})
    waiting: Sequence[WaitingJob]
    # Under `pack: contention`, each job's expected demand (its history: one read a minute).
    history = context.monitor.demand_history() if config.pack == "contention" else None
    now_s = now.timestamp()
    # Neither changes during the loop: asked once, not once per job of a long queue.
    known = history if history else None
    held = bool(waits)
    if views is not None and (history is None or (known is None and not held)):
        waiting = views(admitted.eligible, now)  # nothing to add: the placer's views as kept
    else:
        built: list[WaitingJob] = []
        for job in admitted.eligible:
            wanted, why = restrict(job, now)
            if wanted is None:
                reasons[job.id] = why or "it may run nowhere"
                continue
            if history is not None and (known is not None or held):
                demand, owner_runs = expected_demand(known, job) if known is not None else (None, 0)
                waited = waits.waited_s(job.id, now_s) if held else 0.0
                if demand is not None or waited:
                    wanted = dataclasses.replace(
                        wanted, demand=demand, owner_runs=owner_runs, waited_s=waited
                    )
            built.append(wanted)
        waiting = built
    waiting_users = _waiting_users(admitted.eligible)  # a C loop, once per queue
    users = set(map(_user, holding)) | waiting_users
    head = StoredHeadClaim(context.store.head_claims)
    result = plan(
        slots,
        claims,
        waiting,
        config.headroom_bytes,
        config.max_jobs_per_gpu,
        user_caps={user: user_cap(config, user) for user in users},
        user_usage=recent_usage(jobs, waiting_users, gpus, now, config.fair_share_half_life_s),
        busy_util=config.busy_util,
        head_claim=head.get(),
        topology=topology,
        placement=config.placement,
        pack=config.pack,
    )
    head.keep(result.head_claim)
    if result.quieter or waits:
        waits.note(result.quieter, {job.id for job in admitted.eligible}, now_s)
    if reasons:  # else the plan's own (a long queue's reasons are not copied)
        result.waiting_reasons.update(
            {k: v for k, v in reasons.items() if k not in result.waiting_reasons}
        )
    return Plan(result.placements, result.waiting_reasons, result.budgets)
