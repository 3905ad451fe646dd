"""Requests that read jobs: `status` (one page of the queue), `show`, `array`, `logs`,
`wait`, `history` and `estimate_history`. Every job shown goes through
`services.visible`, and every list is read in chunks and bounded by REPLY_BUDGET."""

from __future__ import annotations

import base64
import os
import pwd
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpusched.core.errors import GpuschedError, NotFoundError, UsageError
from gpusched.core.hints import suggest_mem
from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobState
from gpusched.core.requests.catalog import (
    ArrayRequest,
    EstimateHistoryRequest,
    HistoryRequest,
    LogsRequest,
    ShowRequest,
    StatusRequest,
    WaitRequest,
)
from gpusched.core.requests.protocol import WIRE_REPLY_BYTES
from gpusched.core.requests.replies import (
    EstimateHistoryReply,
    JobJson,
    JobsReply,
    LogsReply,
    StatusPage,
)
from gpusched.daemon.bounds import REPLY_BUDGET, reply_weight
from gpusched.daemon.handlers.admin import drain_json
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.processes.logcap import read_log
from gpusched.scheduling.submit_checks import most_per_gpu
from gpusched.usage.joblog import owned_log

MAX_WAIT_S = 30.0
ENDED_SHOWN = 20  # `status --all`: this many recent ends unless the request asks for more
ENDED_SHOWN_MAX = 1000  # and never more: a reply stays bounded however many have ended
MAX_LOG_CHUNK = 1 << 20

# A status page's jobs, by reply_weight's estimate: half the wire bound, leaving room for
# the estimate's error, the GPUs, the nodes and the counts.
STATUS_PAGE_JOB_BYTES = WIRE_REPLY_BYTES // 2


# A job listed in short (`cut`) past the budget: these long strings left out.
_CUT_FIELDS: dict[str, Any] = {
    "command": [],
    "cwd": "",
    "name": None,
    "notify": None,
    "hints": [],
    "reason_detail": None,
    "waiting_reason": None,
    "log_path": None,
    "output": None,
    "notify_result": None,
    "after": [],
    "after_when": None,
}
_CUT_WEIGHT = reply_weight({**_CUT_FIELDS, "cut": True})


def job_list(
    services: Services, caller: Caller, ids: list[int], done: str | None = None
) -> list[dict[str, Any]]:
    """The jobs as the caller may see them, read in chunks and bounded (`bounded_list`):
    the daemon never holds more of a reply than a client could read."""
    shown = (services.visible(caller, job) for job in services.store.jobs.iter_jobs(ids))
    return bounded_list(shown, len(ids), done)


def bounded_list(
    shown: Iterable[dict[str, Any]], count: int, done: str | None = None
) -> list[dict[str, Any]]:
    """`count` jobs' JSON, refused past REPLY_BUDGET. `done`: what the request did anyway
    (a bulk cancel, a sweep's submit); its reply must say so for every job, so the jobs
    past the budget are listed in short (`cut`: true, their long strings left out), and
    only a list too long even so is an error that says what was done."""
    listed, size = [], 0
    too_long = f"more than one reply holds ({REPLY_BUDGET // 2**20} MiB)"
    for number, whole in enumerate(shown, start=1):
        # Room kept for the rest in short, so that every job of a `done` reply is listed.
        kept = 0 if done is None else (count - number) * _CUT_WEIGHT
        data = whole
        if done is not None and size + reply_weight(whole) + kept > REPLY_BUDGET:
            data = {**whole, **_CUT_FIELDS, "cut": True}
        size += reply_weight(data)
        if size > REPLY_BUDGET:
            if done is not None:
                raise GpuschedError(f"{done}, but listing them is {too_long}")
            raise UsageError(f"the answer lists {count} jobs, {too_long}: ask for fewer")
        listed.append(data)
    return listed


def array(services: Services, caller: Caller, request: ArrayRequest) -> JobsReply:
    ids = services.store.jobs.array_ids(request.array)
    if not ids:
        raise NotFoundError(f"no array a{request.array}")
    return job_list(services, caller, ids)


def status(services: Services, caller: Caller, request: StatusRequest) -> StatusPage:
    """GPUs and one page of active jobs in id order, whatever the queue's length.

    `cursor`: the page after this id (the previous reply's `next`; null at the last
    page); `limit`: jobs per page, at most `status_page_jobs`; `states`: only these
    active states; `user`: only that user's jobs. With `all`, the last page ends with
    the `ended` (default 20, at most ENDED_SHOWN_MAX) most recently ended jobs.
    `counts`: how many jobs (of `user`) are in each active state, all pages together.
    A page holds at most WIRE_REPLY_BYTES of JSON (one job longer than that alone):
    its jobs end early, and with `all` the ended ones that do not fit are left off.
    """
    # One connection for the page's reads; read again once if it was found lost.
    return services.store.database.snapshot(lambda: _status_page(services, caller, request))


def _status_page(services: Services, caller: Caller, request: StatusRequest) -> StatusPage:
    store = services.store
    page_size = services.config.status_page_jobs
    limit = min(page_size, max(1, page_size if request.limit is None else request.limit))
    cursor = max(0, request.cursor)
    states = ACTIVE_STATES
    if request.states is not None:
        states = frozenset(JobState(name) for name in request.states)
    scheduler = services.scheduler
    page = store.jobs.active_page(
        cursor, limit + 1, states, user=request.user, with_nodes=scheduler.in_cluster
    )
    more = False
    jobs: list[dict[str, Any]] = []
    size, last = 0, cursor
    for shown_count, job in enumerate(page.jobs):
        if shown_count == limit:  # the page's one job more: there is a next page
            more = True
            break
        shown = services.visible(caller, job)
        weight = reply_weight(shown)
        if jobs and size + weight > STATUS_PAGE_JOB_BYTES:  # a page of long commands ends early
            more = True
            break
        jobs.append(shown)
        size += weight
        last = job.id
    if not more and request.all:
        ended = min(ENDED_SHOWN_MAX, request.ended or ENDED_SHOWN)
        for job in store.jobs.ended(ended, user=request.user):
            shown = services.visible(caller, job)
            size += reply_weight(shown)
            if size > STATUS_PAGE_JOB_BYTES:  # the oldest of the recent ends are left off
                break
            jobs.append(shown)
    gpus, nodes = scheduler.status_view(store.jobs.running, page.nodes)
    return {
        "gpus": [g.to_json() for g in gpus],
        "nodes": [n.to_json() for n in nodes],
        "jobs": jobs,
        "drain": drain_json(services),
        "next": last if more else None,
        "counts": page.counts,
    }


def show(services: Services, caller: Caller, request: ShowRequest) -> JobJson:
    """One job; with `timeline`, also its memory and utilization over time (`timeline`);
    a waiting one also its `expected_start` (null: unknown) and expected demand."""
    job = services.store.jobs.get(request.id)
    shown = services.visible(caller, job)
    if job.requeue:
        shown["attempts"] = services.store.attempts.earlier_runs([job.id]).get(job.id, [])
    if job.state in (JobState.QUEUED, JobState.HELD):
        # Null where unknown: only the head's claim and its cards' --time can tell.
        shown["expected_start"] = services.scheduler.expected_start(job)
    if job.state in (JobState.QUEUED, JobState.HELD) and job.demand is None:
        # What the policy's rule 3 counts it as until it runs: its history's figure.
        demand, owner_runs = services.scheduler.context.monitor.expected(job)
        if demand is not None:
            shown["expected_demand"] = demand
            shown["expected_from_owner_runs"] = owner_runs
    if request.timeline:
        shown["timeline"] = [p.to_json() for p in services.scheduler.job_timeline(job)]
    return shown


def logs(services: Services, caller: Caller, request: LogsRequest) -> LogsReply:
    job = services.owned_job(caller, request.id)
    offset = max(0, request.offset)
    wanted = MAX_LOG_CHUNK if request.max_bytes is None else request.max_bytes
    limit = min(MAX_LOG_CHUNK, max(1, wanted))
    data, next_offset = b"", offset
    if job.log_path:
        try:
            # O_NOFOLLOW: the daemon reads only the file it created, never a planted link;
            # O_NONBLOCK: a FIFO planted at a user's --output path cannot hold the request.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(job.log_path, flags)
        except FileNotFoundError:
            fd = -1
        except OSError as exc:
            raise GpuschedError(f"cannot read the log of job {job.id}: {exc.strerror}") from None
        if fd >= 0 and not _readable_log(fd, job):
            os.close(fd)
            raise GpuschedError(
                f"cannot read the log of job {job.id}: {job.log_path} is not a regular file"
                " of its owner's any more"
            )
        if job.node is not None and job.node != services.scheduler.node_name:
            fd = elsewhere(job, fd, services.config.log_dir)
        if fd >= 0:
            try:
                # Offsets count all the job wrote: a log cut at max_log_size is read
                # around its cut, so a follower neither re-reads nor waits (logcap).
                data, next_offset = read_log(fd, offset, limit)
            except OSError as exc:
                raise GpuschedError(
                    f"cannot read the log of job {job.id}: {exc.strerror}"
                ) from None
            finally:
                os.close(fd)
    return {
        "data": base64.b64encode(data).decode("ascii"),
        "offset": next_offset,
        "ended": job.state in TERMINAL_STATES,
        "state": str(job.state),
        "log_path": job.log_path,
    }


def _readable_log(fd: int, job: Job) -> bool:
    """A log in log_dir is the supervisor's; one at the user's own path (`--output`)
    is served only if it is a regular file of the job's owner (gpusched.usage.joblog)."""
    if not job.output:
        return True
    try:
        owner = pwd.getpwnam(job.user).pw_uid  # this server's uid for them (a cluster)
    except KeyError:
        owner = job.uid
    return owned_log(fd, owner)


def elsewhere(job: Job, fd: int, log_dir: Path) -> int:
    """The log of a job that ran on another node: `fd` if this server shares its log_dir
    (the job's log is in this server's log_dir, the file is there and its owner's), else
    one line saying where it is."""
    shared = job.log_path is not None and Path(job.log_path).parent == log_dir
    if fd >= 0 and shared:
        try:
            owner = pwd.getpwnam(job.user).pw_uid
        except KeyError:
            owner = -1
        if os.fstat(fd).st_uid == owner:
            return fd
    if fd >= 0:
        os.close(fd)
    raise NotFoundError(
        f"job {job.id} ran on node {job.node}: its log is {job.log_path} there"
        " (log_dir is not shared with this server)"
    )


def wait(services: Services, caller: Caller, request: WaitRequest) -> JobsReply:
    ids = list(request.ids)
    found = services.store.jobs.states_of(ids)
    for each in ids:
        if each not in found:  # unknown ids fail now, not after the timeout
            raise NotFoundError(f"no job {each}")
    timeout = MAX_WAIT_S if request.timeout is None else request.timeout
    timeout = min(max(timeout, 0.0), MAX_WAIT_S)
    services.scheduler.endings.wait_until_ended(ids, timeout)
    return job_list(services, caller, ids)


def estimate_history(
    services: Services, caller: Caller, request: EstimateHistoryRequest
) -> EstimateHistoryReply:
    """A --mem for a command from the peaks of the caller's own earlier runs of it."""
    command = list(request.command)
    runs = services.store.usage.peaks_for_command(caller.uid, command)
    if not runs:
        raise NotFoundError(
            "no earlier run of this exact command by you ended with a measured peak: run it"
            " once with --mem SIZE (`gpusched estimate --params ...` gives a first figure)"
        )
    peak = max(peak for _, peak, _ in runs)
    suggested = suggest_mem(peak)
    scheduler = services.scheduler
    most = most_per_gpu(scheduler.placer.gpus_by_node(), scheduler.context.config.headroom_bytes)
    if most is not None and peak <= most < suggested:  # the margin, not the peak, is too big
        suggested = most
    return {
        "command": command,
        "jobs": [{"id": i, "peak_mem": p, "mem": m} for i, p, m in runs],
        "peak_mem": peak,
        "suggested_mem": suggested,
    }


def history(services: Services, caller: Caller, request: HistoryRequest) -> JobsReply:
    states = TERMINAL_STATES
    if request.states is not None:
        states = frozenset(JobState(name) for name in request.states)
    found = services.store.jobs.ended_ids(
        min(request.limit, 10000), user=request.user, states=states, since=request.since
    )
    shown = job_list(services, caller, found)
    earlier = services.store.attempts.earlier_runs(
        [job["id"] for job in shown if job.get("requeue")]
    )
    for job in shown:
        if job["id"] in earlier:
            job["attempts"] = earlier[job["id"]]
    return shown
