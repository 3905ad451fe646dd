"""The daemon's replies: one type per operation (REPLIES), and `StatusView`, two `status`
pages asked apart as one (merged by gpusched.core.status_pages.merge_status_pages).

Plain dicts on the wire and in memory, typed for mypy: each is a TypedDict or an alias of
one, so reading a reply builds no object and importing this module costs a few class
statements (no command imports it to run: tests/test_cli_imports.py). The handlers
(gpusched.daemon.handlers) declare them as their return types, the client and the
dashboard (gpusched.daemon.web.api) read them. A job is `JobJson`: models.Job.to_json as
the caller may see it (gpusched.daemon.auth hides a stranger's command and directory),
with "attempts" on a requeued job and "timeline" where `show --timeline` asked for it.
"""

# No `from __future__ import annotations`: a TypedDict compiles each string annotation
# into a ForwardRef when its class is made, five times the cost of real types here.
from typing import Any, TypedDict

JobJson = dict[str, Any]  # models.Job.to_json, as the caller may see it
GpuJson = dict[str, Any]  # models.GpuReport.to_json
NodeJson = dict[str, Any]  # models.NodeStatus.to_json
DrainJson = dict[str, Any]  # models.Drain.to_json


class PingReply(TypedDict):
    version: str
    pid: int
    started: float  # epoch seconds
    user: str  # who is asking, as the daemon sees them (SO_PEERCRED)
    uid: int
    daemon_user: str  # whose daemon this is
    daemon_uid: int
    single_user: bool


class StatusPage(TypedDict):
    """One page of `status`: the GPUs, the cluster's nodes, the drain, and jobs in id
    order; `next`: the cursor of the next page (null at the last); `counts`: the active
    jobs in each state, all pages together."""

    gpus: list[GpuJson]
    nodes: list[NodeJson]
    jobs: list[JobJson]
    drain: DrainJson | None
    next: int | None
    counts: dict[str, int]


class LogsReply(TypedDict):
    data: str  # base64
    offset: int  # where the next read starts
    ended: bool
    state: str
    log_path: str | None


class EstimatedRun(TypedDict):
    id: int
    peak_mem: int
    mem: int | None


class EstimateHistoryReply(TypedDict):
    command: list[str]
    jobs: list[EstimatedRun]
    peak_mem: int
    suggested_mem: int


class PruneReply(TypedDict):
    """What a prune deleted (gpusched.daemon.retention.PruneReport)."""

    jobs: int  # rows deleted (with dry_run: that would be)
    log_bytes: int
    more: bool  # always false now; older clients ask again while it is true
    cutoff: str  # jobs that ended before this time (ISO, UTC)


class ReloadReply(TypedDict):
    kept: list[str]  # the keys that need a restart, kept as they were


class _Placement(TypedDict):
    job: JobJson


class PlacementReply(_Placement, total=False):
    """The interactive job; once it runs, also what its process needs to use its GPUs."""

    env: dict[str, str]
    env_defaults: dict[str, str]
    kill_grace_s: float


JobsReply = list[JobJson]  # several jobs: wait, history, array, submitted


class RefusedJson(TypedDict):
    """A job of a `change` left as it was, and why."""

    id: int
    error: str


class ChangeReply(TypedDict):
    """The jobs a `change` changed (as they are after it), and those it refused."""

    jobs: list[JobJson]
    refused: list[RefusedJson]


OneOrManyJobs = JobJson | JobsReply  # submit (a sweep: its array), cancel (mine, array)
DrainReply = DrainJson | None  # the drain in force after the request, if any

# Each operation's reply, by `op` (as requests.catalog.REQUESTS names the requests).
REPLIES: dict[str, Any] = {
    "ping": PingReply,
    "submit": OneOrManyJobs,
    "submitted": JobsReply,
    "status": StatusPage,
    "show": JobJson,
    "logs": LogsReply,
    "cancel": OneOrManyJobs,
    "hold": JobJson,
    "release": JobJson,
    "wait": JobsReply,
    "history": JobsReply,
    "priority": JobJson,
    "change": ChangeReply,
    "requeue": JobJson,
    "array": JobsReply,
    "estimate_history": EstimateHistoryReply,
    "drain": DrainReply,
    "top": JobJson,
    "prune": PruneReply,
    "reload": ReloadReply,
    "run": JobJson,
    "placement": PlacementReply,
    "run_ended": JobJson,
}

# Whatever a handler returns (gpusched.daemon.handlers.Handler).
Reply = (
    PingReply
    | StatusPage
    | LogsReply
    | EstimateHistoryReply
    | PruneReply
    | ReloadReply
    | PlacementReply
    | ChangeReply
    | JobJson
    | JobsReply
    | None
)


class StatusView(TypedDict):
    """Two status pages asked apart, as one: every running job (and, with `all`, the
    recent ends) from the first, the first waiting jobs from the second."""

    gpus: list[GpuJson]
    nodes: list[NodeJson]
    drain: DrainJson | None
    counts: dict[str, int]  # the waiting page's: it was asked for every waiting state
    running: list[JobJson]
    waiting: list[JobJson]
    more_waiting: int  # waiting jobs counted but not listed
