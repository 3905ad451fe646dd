"""Requests that change jobs: `submit` (one job or a sweep's array), `requeue`,
`priority`, `hold`, `release` and `cancel`. Each acts only on a job `services.owned_job`
lets the caller touch, and answers with the jobs as `services.visible` shows them."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gpusched.core.errors import (
    ConflictError,
    GpuschedError,
    NotFoundError,
    ProtocolError,
    UsageError,
)
from gpusched.core.models import TERMINAL_STATES, Job, JobState
from gpusched.core.requests.catalog import (
    MAX_NAME_CHARS,
    CancelRequest,
    ChangeRequest,
    HoldRequest,
    PriorityRequest,
    ReleaseRequest,
    RequeueRequest,
    SubmitRequest,
    SubmittedRequest,
)
from gpusched.core.requests.replies import ChangeReply, JobJson, JobsReply, OneOrManyJobs
from gpusched.core.requests.sweep import expand, swept_name
from gpusched.daemon.auth import is_theirs
from gpusched.daemon.bounds import check_env, check_submit
from gpusched.daemon.handlers.args import text
from gpusched.daemon.handlers.views import bounded_list, job_list
from gpusched.daemon.identity import (
    Caller,
    account_gid,
    can_enter,
    can_write_in,
    sticky_shared,
)
from gpusched.daemon.services import Services
from gpusched.processes.output import output_directory, output_template
from gpusched.scheduling.host_limits import check_host_ask
from gpusched.store import NewJob
from gpusched.store.submits import request_ids


def submit(services: Services, caller: Caller, request: SubmitRequest) -> OneOrManyJobs:
    _refuse_on_full_disk(services, caller, request)
    config = services.config
    if caller.uid != 0:
        problem = can_enter(caller.uid, account_gid(caller), request.cwd)
        if problem is not None:
            raise UsageError(problem)
    check_env(request.env, config)
    output = None
    if request.output is not None:
        output = output_template(request.output, request.cwd, request.sweep is not None)
        directory = output_directory(output)
        problem = None
        if caller.uid != 0:
            problem = can_write_in(caller.uid, account_gid(caller), directory)
        problem = problem or sticky_shared(directory)
        if problem is not None:
            raise UsageError(problem)
    new = NewJob(
        user=caller.user,
        uid=caller.uid,
        gid=account_gid(caller),
        command=list(request.command),
        cwd=request.cwd,
        env=dict(request.env),
        umask=request.umask,
        mem=request.mem,
        gpus=request.gpus,
        name=request.name,
        priority=request.priority,
        after=request.after,
        after_when=request.after_when,
        held=request.hold,
        time_limit_s=request.time,
        max_concurrent=request.max_concurrent,
        notify=request.notify,
        retry_oom=request.retry_oom,
        allowed_nodes=request.nodes,
        requeue=request.requeue,
        exclusive=request.exclusive,
        share=request.share,
        output=output,
        request_id=request.request_id,
        ram=request.ram,
        cpus=request.cpus,
    )
    if request.ram is not None or request.cpus is not None:
        host_ask_checked(services, caller.user, request.ram, request.cpus)
    command, name = list(request.command), request.name
    if request.sweep is None:
        check_submit(config, command, None, name, new.after)
        _charge(services, caller, new, [new])
        return services.visible(caller, services.scheduler.submit(new))
    pairs = [(key, list(values)) for key, values in request.sweep]
    check_submit(config, command, pairs, name, new.after)  # before expanding
    news = [
        replace(new, command=argv, name=swept_name(name, text(label), MAX_NAME_CHARS))
        for argv, label in expand(command, pairs, config.max_array_jobs)
    ]
    if request.request_id is not None:  # unique per row: the first keeps the id itself
        ids = request_ids(request.request_id, len(news))
        news = [replace(each, request_id=rid) for each, rid in zip(news, ids, strict=True)]
    _charge(services, caller, new, news)
    jobs = services.scheduler.submit_many(news, as_array=True)
    shown = (services.visible(caller, job) for job in jobs)
    return bounded_list(shown, len(jobs), done=f"{len(jobs)} jobs queued")


def host_ask_checked(services: Services, user: str, ram: int | None, cpus: int | None) -> None:
    """`--ram` and `--cpus` (of `submit` and `run`): enforced by this server's cgroups,
    and within what it gives; else UsageError."""
    scheduler = services.scheduler
    if scheduler.in_cluster:
        raise UsageError("--ram and --cpus are not taken in a cluster yet: ask without them")
    facts = scheduler.context.launcher.host_facts()
    check_host_ask(user, ram, cpus, facts, services.config)


def _refuse_on_full_disk(services: Services, caller: Caller, request: SubmitRequest) -> None:
    """A full disk's room goes to the jobs already queued: a new submit is refused, in
    words that say nothing was queued (a retry of one that was queued is answered)."""
    full = services.store.disk_full()
    if full is None:
        return
    if request.request_id is not None and services.store.jobs.made_by_request(
        caller.user, request.request_id
    ):
        return  # a retry whose first try was queued: answered with its jobs
    raise GpuschedError(
        f"{full}: submit refused, nothing was queued; submits are accepted once there is room"
    )


def submitted(services: Services, caller: Caller, request: SubmittedRequest) -> JobsReply:
    """What became of the caller's submit with this request id (its answer was lost): the
    jobs it made, or NotFoundError if it made none (it never reached the database)."""
    made = services.store.jobs.made_by_request(caller.user, request.request_id)
    if not made:
        raise NotFoundError(f"no job was queued by submit request {request.request_id}")
    shown = (services.visible(caller, job) for job in made)
    return bounded_list(shown, len(made), done=f"{len(made)} jobs queued")


def _charge(services: Services, caller: Caller, new: NewJob, news: list[NewJob]) -> None:
    """Count what the submit stores against the caller's budget (gpusched.daemon.storage_budget)."""
    if caller.uid == 0:
        return
    row_bytes = sum(stored_bytes(job) for job in news)
    services.budget.charge(caller.user, new.env, row_bytes, services.config.retention, time.time())


def stored_bytes(job: NewJob) -> int:
    """The bytes of one job's row that its submitter chose: every text it stores per job
    (command, name, `--notify`, `--cwd`, `--output`); the environment is counted apart."""
    texts = [*job.command, *(job.notify or ()), job.name or "", job.cwd, job.output or ""]
    return sum(len(text.encode("utf-8", "surrogatepass")) + 1 for text in texts)


def priority(services: Services, caller: Caller, request: PriorityRequest) -> JobJson:
    job = services.owned_job(caller, request.id)
    return services.visible(caller, services.scheduler.waiting.set_priority(job, request.priority))


def requeue(services: Services, caller: Caller, request: RequeueRequest) -> JobJson:
    """A new job with the same spec as an ended one (its dependencies are not carried over).

    An OOM retry's memory is the grown one, and `--retry-oom` is the count the user first
    gave (the first attempt's), not what the retries left of it.
    """
    old = services.owned_job(caller, request.id)
    if old.state not in TERMINAL_STATES:
        raise ConflictError(f"job {old.id} is {old.state}: only an ended job can be requeued")
    if old.interactive:  # it ran in its caller's terminal, with an environment never stored
        raise ConflictError(
            f"job {old.id} was interactive (gpusched run, claim()): run it again the same way"
        )
    info = services.store.jobs.launch_info(old.id)
    if info.env_dropped:
        raise ConflictError(
            f"job {old.id}'s environment was deleted (retention.environments):"
            " submit the command again"
        )
    first = old if old.retry_of is None else services.store.jobs.get(old.retry_of)
    new = NewJob(
        user=old.user,
        uid=old.uid,
        gid=info.gid,
        command=old.command,
        cwd=old.cwd,
        env=info.env,
        umask=info.umask,
        mem=old.mem,
        gpus=old.gpus,
        # A swept job's name carries its sweep values; out of its array, nothing would
        # hide them from other users (the command, which holds them, still shows to you).
        name=old.name if old.array_id is None else None,
        priority=old.priority,
        time_limit_s=old.time_limit_s,
        retry_oom=first.retry_oom or 0,
        notify=tuple(old.notify) if old.notify else None,  # the same `--notify` hook
        allowed_nodes=tuple(old.allowed_nodes) if old.allowed_nodes else None,  # `--node`
        requeue=bool(old.requeue),
        output=old.output,  # the same `--output` template
        exclusive=old.exclusive,
        share=old.share,
        ram=old.ram,
        cpus=old.cpus,
    )
    return services.visible(caller, services.scheduler.submit(new))


def hold(services: Services, caller: Caller, request: HoldRequest) -> JobJson:
    job = services.owned_job(caller, request.id)
    return services.visible(caller, services.scheduler.waiting.hold(job))


def release(services: Services, caller: Caller, request: ReleaseRequest) -> JobJson:
    job = services.owned_job(caller, request.id)
    return services.visible(caller, services.scheduler.waiting.release(job))


def change(services: Services, caller: Caller, request: ChangeRequest) -> ChangeReply:
    """Hold, release or set the priority of many jobs in one pass: those the caller may not
    act on (or that do not exist) are refused one by one, the others changed together."""
    mine: list[Job] = []
    refused: dict[int, str] = {}
    for job_id in request.ids:
        try:
            mine.append(services.owned_job(caller, job_id))
        except GpuschedError as exc:
            refused[job_id] = exc.message
    changed: list[Job] = []
    if mine:
        changed, conflicts = services.scheduler.waiting.change_many(
            mine, request.action, request.priority or 0
        )
        refused.update(conflicts)
    return {
        "jobs": [services.visible(caller, job) for job in changed],
        "refused": [{"id": i, "error": refused[i]} for i in request.ids if i in refused],
    }


def cancel(services: Services, caller: Caller, request: CancelRequest) -> OneOrManyJobs:
    if request.mine:
        return _cancel_mine(services, caller, request.waiting_only)
    if request.array is not None:
        return _cancel_array(services, caller, request.array)
    if request.id is None:  # CancelRequest refuses it: an id, an array or `mine`
        raise ProtocolError("request is missing 'id'")
    job = services.owned_job(caller, request.id)
    detail = WITHDRAWN if request.withdrawn and job.interactive else None
    return services.visible(caller, services.scheduler.cancel(job, by=caller.user, detail=detail))


WITHDRAWN = "withdrawn: its process (claim() or gpusched run) stopped waiting before it started"


def _cancel_mine(services: Services, caller: Caller, waiting_only: bool) -> JobsReply:
    """Every active job of the caller's own (root's and admins' too: others' only by id)."""
    by_name = services.scheduler.in_cluster  # a uid means nothing on another server
    name = caller.user if by_name else None
    ids = services.scheduler.waiting.cancel_waiting(caller.uid, caller.user, user=name)
    running = [] if waiting_only else services.store.jobs.running()
    running = [j for j in running if is_theirs(j, caller, by_name)]
    return _cancelled(services, caller, ids, running, waiting_only)


def _cancel_array(services: Services, caller: Caller, array_id: int) -> JobsReply:
    """The array's waiting jobs in one transaction, then its running ones one by one."""
    everything = services.store.jobs.array_jobs(array_id)
    if not everything:
        raise NotFoundError(f"no array a{array_id}")
    owner = services.owned_job(caller, everything[0].id)  # one submit: one owner
    ids = services.scheduler.waiting.cancel_waiting(owner.uid, caller.user, array_id=array_id)
    running = [j for j in everything if j.state == JobState.RUNNING]
    return _cancelled(services, caller, ids, running, waiting_only=False)


def _cancelled(
    services: Services, caller: Caller, ids: list[int], running: list[Job], waiting_only: bool
) -> list[dict[str, Any]]:
    """The jobs cancelled at once (`ids`), then `running` cancelled one by one."""
    # In chunks under the lock, one wake-up for all (a pass per job took minutes).
    ids.extend(services.scheduler.cancel_many(running, caller.user, waiting_only))
    return job_list(services, caller, ids, done=f"{len(ids)} jobs cancelled")
