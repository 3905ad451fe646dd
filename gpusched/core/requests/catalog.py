"""The requests the daemon answers: one frozen dataclass per operation, with the checks of
its fields that need no daemon state.

One definition serves three readers: the client builds a request object (so a bad value
fails before any socket is opened, with the same words the daemon would use), the
daemon's handlers receive one parsed from the wire by gpusched.core.requests.wire.parse
(wrong types refused as a ProtocolError, impossible values as a UsageError, never a
crash), and the protocol fuzz test walks REQUESTS to know every operation and field.
Checks that need the daemon (the configured bounds, whether the caller may enter a
directory) stay in the handlers. The base class and shared checks: requests.base; the
interactive requests (`gpusched run`, claim()): requests.interactive; `status` and
`show`, which the client sends without importing this module: requests.views.
"""

from __future__ import annotations

from collections.abc import Mapping  # at run time: requests.wire resolves the annotations
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import ClassVar

from gpusched.core.clock import iso
from gpusched.core.errors import ProtocolError, UsageError
from gpusched.core.models import TERMINAL_STATES
from gpusched.core.requests.base import (
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    JobRequest,
    Request,
    job_id,
    normalise,
    shape,
    unique_ids,
)
from gpusched.core.requests.checks import NODE_NAME, check_request_id, check_submit
from gpusched.core.requests.interactive import PlacementRequest, RunEndedRequest, RunRequest
from gpusched.core.requests.views import ShowRequest, StatusRequest
from gpusched.core.sanitize import shown

__all__ = ["MAX_NAME_CHARS", "REQUESTS", "Request"]


@dataclass(frozen=True)
class PingRequest(Request):
    op: ClassVar[str] = "ping"


@dataclass(frozen=True)
class SubmitRequest(Request):
    """Queue `command` (one job) or one job per combination of `sweep`'s values (an array).

    `mem`: bytes per GPU, None for whole GPUs; `time`: a limit in seconds; `notify`: an
    argv run as the owner when the job ends; `umask`: the submitter's, for the job.
    """

    op: ClassVar[str] = "submit"
    command: tuple[str, ...] = field(metadata=shape("'command' must be a list of strings"))
    cwd: str
    env: Mapping[str, str] = field(
        default_factory=dict, metadata=shape("'env' must map strings to strings")
    )
    umask: int = 0o022
    mem: int | None = None
    gpus: int = 1
    name: str | None = None
    priority: int = 0
    after: tuple[int, ...] = field(default=(), metadata=shape("'after' must be a list of job ids"))
    # How each of `after` must end (core.after: ok, any, failed), in its order; None: ok.
    after_when: tuple[str, ...] | None = field(
        default=None, metadata=shape("'after_when' must be a list of conditions")
    )
    hold: bool = False
    time: float | None = None
    max_concurrent: int | None = None
    notify: tuple[str, ...] | None = None
    retry_oom: int = 0
    nodes: tuple[str, ...] | None = field(  # `--node a,b`: the servers it may run on
        default=None, metadata=shape("'nodes' must be a list of node names")
    )
    requeue: bool = False  # `--requeue`: queued again if its server dies while it runs
    exclusive: bool = False  # `--exclusive`: a card to itself
    share: bool = False  # `--share`: light, shares a busy card (the policy's rule 3)
    output: str | None = None  # `--output`: the log's path (gpusched.processes.output)
    ram: int | None = None  # `--ram`: host memory, bytes (its cgroup's limit); None: default
    cpus: int | None = None  # `--cpus`: cores of its own (its cgroup's cpuset); None: default
    sweep: tuple[tuple[str, tuple[str, ...]], ...] | None = field(
        default=None, metadata=shape("'sweep' must be a list of [name, [values...]]")
    )
    # The client's id of this submit: sent again with a retry, it answers the job(s) the
    # first try made instead of making more (a reply lost after the commit).
    request_id: str | None = None

    def __post_init__(self) -> None:
        # The checks are a plain function, so that the CLI's fast path runs the same ones
        # without this class.
        notify, after, after_when = check_submit(
            command=self.command,
            cwd=self.cwd,
            umask=self.umask,
            mem=self.mem,
            gpus=self.gpus,
            name=self.name,
            time=self.time,
            max_concurrent=self.max_concurrent,
            sweep=self.sweep,
            nodes=self.nodes,
            exclusive=self.exclusive,
            share=self.share,
            retry_oom=self.retry_oom,
            notify=self.notify,
            after=self.after,
            request_id=self.request_id,
            after_when=self.after_when,
            ram=self.ram,
            cpus=self.cpus,
        )
        normalise(self, "notify", notify)
        normalise(self, "after", after)
        normalise(self, "after_when", after_when)


@dataclass(frozen=True)
class SubmittedRequest(Request):
    """What became of a submit whose answer was lost: the caller's jobs it made."""

    op: ClassVar[str] = "submitted"
    request_id: str

    def __post_init__(self) -> None:
        check_request_id(self.request_id)


@dataclass(frozen=True)
class LogsRequest(JobRequest):
    """At most `max_bytes` (the daemon caps it) of a job's log from `offset`."""

    op: ClassVar[str] = "logs"
    offset: int = 0
    max_bytes: int | None = None


@dataclass(frozen=True)
class CancelRequest(Request):
    """One job (`id`), an array's jobs (`array`), or every active job of the caller's
    (`mine`; `waiting_only`: the queued and held ones only)."""

    op: ClassVar[str] = "cancel"
    id: int | None = None
    array: int | None = None
    mine: bool = False
    waiting_only: bool = False
    # The job's own waiting process (claim(), gpusched run) gave up before it started: the
    # job's reason says "withdrawn", not "cancelled by <user>".
    withdrawn: bool = False

    def __post_init__(self) -> None:
        if not self.mine and self.array is None:
            if self.id is None:
                raise ProtocolError("request is missing 'id'")
            job_id(self.id)


@dataclass(frozen=True)
class HoldRequest(JobRequest):
    op: ClassVar[str] = "hold"


@dataclass(frozen=True)
class ReleaseRequest(JobRequest):
    op: ClassVar[str] = "release"


@dataclass(frozen=True)
class RequeueRequest(JobRequest):
    op: ClassVar[str] = "requeue"


@dataclass(frozen=True)
class PriorityRequest(JobRequest):
    op: ClassVar[str] = "priority"
    priority: int


# What a `change` request does to each of its jobs.
CHANGES = ("hold", "release", "priority")


@dataclass(frozen=True)
class ChangeRequest(Request):
    """Hold, release or set the priority of many waiting jobs at once: one transaction
    and one scheduling pass for them all, not one of each per job. `priority`: the
    action `priority`'s value (the other actions leave it unused)."""

    op: ClassVar[str] = "change"
    ids: tuple[int, ...] = field(default=(), metadata=shape("'ids' must be a list of job ids"))
    action: str = "release"
    priority: int | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise UsageError("no job ids to change")
        if self.action not in CHANGES:
            raise ProtocolError(f"'action' must be one of {', '.join(CHANGES)}")
        if self.action == "priority" and self.priority is None:
            raise ProtocolError("the action 'priority' needs a 'priority'")
        normalise(self, "ids", unique_ids("ids", self.ids))


@dataclass(frozen=True)
class TopRequest(JobRequest):
    """An administrator puts a waiting job ahead of every user's (`gpusched top`)."""

    op: ClassVar[str] = "top"


@dataclass(frozen=True)
class WaitRequest(Request):
    """Until every job of `ids` has ended, or `timeout` seconds (the daemon caps it)."""

    op: ClassVar[str] = "wait"
    ids: tuple[int, ...] = field(default=(), metadata=shape("'ids' must be a list of job ids"))
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise UsageError("no job ids to wait for")
        normalise(self, "ids", unique_ids("ids", self.ids))


@dataclass(frozen=True)
class HistoryRequest(Request):
    """Ended jobs, most recent first: at most `limit`, of `user`, in `states`, ended at or
    after `since` (an ISO time with its zone; held normalised to UTC as ends are stored)."""

    op: ClassVar[str] = "history"
    limit: int = 50
    user: str | None = None
    states: tuple[str, ...] | None = None
    since: str | None = None

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise UsageError("--limit must be at least 1")
        if self.states is not None:
            unknown = sorted(set(self.states) - {str(s) for s in TERMINAL_STATES})
            if unknown or not self.states:
                raise UsageError(
                    f"--state {shown(','.join(unknown)) or '(none)'}: an ended job is one of "
                    + ", ".join(sorted(str(s) for s in TERMINAL_STATES))
                )
        if self.since is not None:
            normalise(self, "since", _utc_iso(self.since))


def _utc_iso(text: str) -> str:
    """An ISO timestamp with its time zone, as `ended_at` is stored (UTC, milliseconds)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"'since': not an ISO date and time: {text!r}") from None
    if moment.tzinfo is None:
        raise UsageError(f"'since': {text!r} has no time zone")
    try:
        return iso(moment.astimezone(timezone.utc))
    except OverflowError:  # 0001-01-01T00:00+05:00 is before the year 1 in UTC
        raise UsageError(f"'since': {text!r} is out of range in UTC") from None


@dataclass(frozen=True)
class ArrayRequest(Request):
    op: ClassVar[str] = "array"
    array: int


@dataclass(frozen=True)
class EstimateHistoryRequest(Request):
    """A --mem for `command` from the peaks of the caller's earlier runs of it."""

    op: ClassVar[str] = "estimate_history"
    command: tuple[str, ...] = field(
        default=(), metadata=shape("'command' must be a list of strings")
    )

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: gpusched estimate --history -- COMMAND [ARGS...]")


@dataclass(frozen=True)
class DrainRequest(Request):
    """Stop new jobs from starting (`on`, with an optional `reason`), or let them start."""

    op: ClassVar[str] = "drain"
    on: bool
    reason: str | None = None
    node: str | None = None  # `--node NAME`: that server of the cluster; None: this one

    def __post_init__(self) -> None:
        if self.on and self.reason is not None and not 0 < len(self.reason) <= MAX_REASON_CHARS:
            raise UsageError(f"a drain reason is 1 to {MAX_REASON_CHARS} characters")
        if self.node is not None and not NODE_NAME.fullmatch(self.node):
            raise UsageError(f"--node {self.node!r}: not a node name")


@dataclass(frozen=True)
class ReloadRequest(Request):
    """Read the config file again and apply it (administrators only); the answer says
    what was kept, or the error that left the old config in force."""

    op: ClassVar[str] = "reload"


MAX_PRUNE_AGE_S = 100 * 365 * 86400.0  # past any date a job could have ended


@dataclass(frozen=True)
class PruneRequest(Request):
    """Forget jobs that ended more than `ended_before_s` seconds ago: their rows, logs,
    timelines and job directories (administrators only). `dry_run`: only count them."""

    op: ClassVar[str] = "prune"
    ended_before_s: float
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.ended_before_s <= MAX_PRUNE_AGE_S:  # NaN too
            raise UsageError("--ended-before: a duration up to 100 years, e.g. 90d")


REQUESTS: dict[str, type[Request]] = {
    kind.op: kind
    for kind in (
        PingRequest,
        SubmitRequest,
        SubmittedRequest,
        StatusRequest,
        ShowRequest,
        LogsRequest,
        CancelRequest,
        HoldRequest,
        ReleaseRequest,
        WaitRequest,
        HistoryRequest,
        PriorityRequest,
        ChangeRequest,
        TopRequest,
        RequeueRequest,
        ArrayRequest,
        EstimateHistoryRequest,
        DrainRequest,
        PruneRequest,
        ReloadRequest,
        RunRequest,
        PlacementRequest,
        RunEndedRequest,
    )
}
