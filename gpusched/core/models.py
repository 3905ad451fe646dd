"""Plain data shared by the client and the daemon: jobs, their states, GPUs.

No SQLAlchemy, no pynvml here: the CLI imports this module. Field names follow the
JSON interface contract (docs in README.md), so `to_json()` is the wire format.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class _StrEnum(str, enum.Enum):
    """A string enum that prints as its value (enum.StrEnum needs Python 3.11)."""

    def __str__(self) -> str:
        return str(self.value)


class JobState(_StrEnum):
    QUEUED = "queued"
    HELD = "held"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def is_waiting(self) -> bool:
        return self in (JobState.QUEUED, JobState.HELD)


ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.HELD, JobState.RUNNING})
TERMINAL_STATES = frozenset(set(JobState) - ACTIVE_STATES)


class EndReason(_StrEnum):
    """Why a job ended (JSON field `reason`)."""

    EXIT = "exit"
    SIGNAL = "signal"
    CANCELLED = "cancelled"
    FAILED_TO_START = "failed_to_start"
    LOST = "lost"
    OOM = "oom"
    # The kernel's OOM killer stopped it for host memory (the service's cgroup was full):
    # never retried by --retry-oom, which grows GPU memory.
    HOST_OOM = "host_oom"
    OVERRUN = "overrun"
    TIMEOUT = "timeout"
    DEPENDENCY_FAILED = "dependency_failed"
    NODE_LOST = "node_lost"  # its node was declared down while it ran (docs/cluster.md)
    IDLE = "idle"  # an interactive job ended for its idleness (interactive.on_idle: end)


class StopIntent(_StrEnum):
    """Why the daemon asked a running job's supervisor to stop it (column `stop_intent`).

    Recorded before the signal is sent and read when the supervisor reports the end: its
    record says only "cancelled" (stopped on request). A time limit is not an intent of
    the daemon's: the supervisor enforces it and reports the outcome `timeout` itself.
    """

    CANCEL = "cancel"
    OVERRUN = "overrun"
    # An interactive job past its --time: its client is asked to stop its command (a
    # batch job's supervisor enforces the limit itself and reports `timeout`).
    TIMEOUT = "timeout"
    IDLE = "idle"  # an interactive job idle past `interactive.idle_timeout` (on_idle: end)


class GpuHealth(_StrEnum):
    OK = "ok"
    LOST = "lost"
    EXCLUDED = "excluded"


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as the driver reports it."""

    pid: int
    used_bytes: int | None  # NVML may not know (e.g. inside a container, or on WDDM)


@dataclass(frozen=True)
class GpuState:
    """One GPU as the probe read it at one instant."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    util_percent: int | None = None
    health: GpuHealth = GpuHealth.OK
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None  # why the GPU is lost / unreadable


@dataclass
class Job:
    """A job as stored and as shown; the JSON contract's JOB object."""

    id: int
    user: str
    uid: int
    command: list[str]
    cwd: str
    state: JobState = JobState.QUEUED
    name: str | None = None
    mem: int | None = None  # bytes per GPU; None = a whole GPU
    gpus: int = 1
    ram: int | None = None  # `--ram`: host memory, bytes; None: its GPUs' share
    cpus: int | None = None  # `--cpus`: cores of its own; None: its GPUs' share
    gpu_indices: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    priority: int = 0
    after: list[int] = field(default_factory=list)
    after_when: list[str] | None = None  # how each of `after` must end (core.after)
    submitted_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    # How long it ran, in seconds, as its supervisor measured on the monotonic clock (a
    # jump of the wall clock moves started_at or ended_at, never this); None: not known
    # (still running, or ended without a record), and ended_at - started_at stands in.
    run_s: float | None = None
    # What it used of the host, as its supervisor recorded at its end: the most memory its
    # cgroup held at once (bytes; None: it had none) and its processes' CPU time (s).
    host_peak: int | None = None
    cpu_s: float | None = None
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    reason_detail: str | None = None  # the sentence behind `reason` (signal name, error...)
    waiting_reason: str | None = None
    log_path: str | None = None
    # Why the daemon removed its log early (its owner's share of log_dir was full).
    log_removed: str | None = None
    peak_mem: int | None = None
    mean_util: float | None = None
    hints: list[str] = field(default_factory=list)
    util_min: int | None = None  # utilization (0-100) over the polls while it held memory
    util_max: int | None = None
    util_stddev: float | None = None
    overrun_at: str | None = None  # when it was first seen over its declared memory + margin
    retry_oom: int | None = None  # OOM retries it may still have (submit --retry-oom N)
    retry_of: int | None = None  # an OOM retry: the first attempt's id (its place in the queue)
    retried_as: int | None = None  # ended out of memory and was retried as this job
    array_id: int | None = None  # jobs of one --sweep share it
    array_index: int | None = None
    max_concurrent: int | None = None  # how many of its array may run at once
    time_limit_s: float | None = None
    notify: list[str] | None = None  # `submit --notify`: argv run as the owner when it ends
    # How that hook ended: {"kind": exit|timeout|failed_to_start, "exit_code", "output"
    # (the end of what it printed, at most NOTIFY_OUTPUT_CHARS)}; None until it has run.
    notify_result: dict[str, Any] | None = None
    # `submit --output`: the log's path template ({id}, {array}, {index}); None: log_dir.
    output: str | None = None
    node: str | None = None  # the server it was placed on (runs on, ran on)
    allowed_nodes: list[str] | None = None  # `submit --node a,b`; None: any node
    requeue: int | None = None  # `submit --requeue`: 1 puts it back in the queue if its node dies
    # `gpusched run` / `gpusched.claim()`: the job is its client process (pid), which runs
    # the command itself, in the caller's terminal; it has no log.
    interactive: bool = False
    warning: str | None = None  # e.g. an idle interactive job (not stored: each pass's)
    exclusive: bool = False  # `--exclusive`: a card to itself
    share: bool = False  # `--share`: its owner says it is light (shares a busy card)
    top: int | None = None  # put first by an administrator (`gpusched top`); lower first
    # Its GPU demand: the share of a card's busy time it takes alone, 0.0-1.0 (measured
    # while it runs; gpusched.usage.demand), and, when it took turns on a busy card, with
    # which busy jobs and at what speed against alone (0.5: half speed).
    demand: float | None = None
    shared_with: list[int] | None = None
    sharing_speed: float | None = None
    # Running: bytes its processes hold on its busiest GPU at the last poll (not stored).
    mem_used: int | None = None
    # A requeued job's earlier runs, oldest first: {"attempt", "node", "started_at",
    # "ended_at", "outcome"} each (the job's own fields are its latest run). Given by
    # `show` and `history`; None elsewhere.
    attempts: list[dict[str, Any]] | None = None
    # Listed in short: a reply past its budget (a bulk cancel's) leaves out its command
    # and other long strings. In the JSON only where true.
    cut: bool = False

    def to_json(self) -> dict[str, Any]:
        # Every field is a scalar or a flat list: a shallow copy of each list is all that
        # dataclasses.asdict's recursive deep copy did, at a fifth of its cost per job
        # (replies list thousands of jobs).
        data = {
            f.name: list(value) if isinstance(value := getattr(self, f.name), list) else value
            for f in dataclasses.fields(self)
        }
        data["state"] = str(self.state)
        if not self.cut:
            del data["cut"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["state"] = JobState(values.get("state", "queued"))
        return cls(**values)


@dataclass
class GpuReport:
    """One GPU as `status` shows it: the probe's reading plus gpusched's bookkeeping."""

    index: int
    uuid: str
    name: str
    total: int
    used: int
    free: int
    reserved: int  # held for running gpusched jobs beyond what they use yet
    available: int  # what the next job could get
    used_by_jobs: int  # memory the driver attributes to gpusched jobs' processes
    used_by_others: int  # memory held by processes gpusched did not start
    util: int | None
    state: str
    jobs: list[int] = field(default_factory=list)
    error: str | None = None
    node: str | None = None  # the server it is on
    short: int = 0  # bytes of its jobs' reservations its free memory cannot cover
    # Bytes each running gpusched job holds on this GPU, by job id (as a string: JSON keys).
    job_mem: dict[str, int] = field(default_factory=dict)
    # Processes gpusched did not start: {"pid", "user", "command" (program name), "used"}.
    others: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuReport:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class NodeStatus:
    """One server of the cluster as `status` shows it (JSON `nodes`)."""

    name: str
    state: str  # up, down or drained
    last_seen: float  # seconds since it was last heard
    gpus: list[GpuReport] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "last_seen": self.last_seen,
            "gpus": [g.to_json() for g in self.gpus],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeStatus:
        gpus = [GpuReport.from_json(g) for g in data.get("gpus", [])]
        return cls(str(data["name"]), str(data["state"]), float(data["last_seen"]), gpus)


@dataclass(frozen=True)
class Drain:
    """An administrator's "start nothing new": running jobs go on, the queue waits."""

    by: str
    since: str  # ISO 8601, UTC
    reason: str | None = None

    def describe(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"draining since {self.since[:16].replace('T', ' ')} UTC (by {self.by}{why})"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Drain:
        return cls(str(data["by"]), str(data["since"]), data.get("reason"))


@dataclass
class Status:
    """`Client.status()`: the GPUs, the jobs, and the drain in force, if any."""

    gpus: list[GpuReport]
    jobs: list[Job]
    drain: Drain | None = None  # an administrator's "start nothing new", if in force

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Status:
        drain = data.get("drain")  # absent from older daemons
        return cls(
            [GpuReport.from_json(g) for g in data["gpus"]],
            [Job.from_json(j) for j in data["jobs"]],
            None if drain is None else Drain.from_json(drain),
        )


@dataclass
class LogChunk:
    """`Client.logs()`: the output from `offset` on, and whether the job has ended."""

    data: bytes
    offset: int
    ended: bool
    state: str

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> LogChunk:
        import base64  # only where logs are read

        data = base64.b64decode(reply["data"])
        return cls(data, reply["offset"], reply["ended"], reply["state"])


@dataclass(frozen=True)
class TimelinePoint:
    """One point of a job's time series (`show --json`'s `timeline`, the dashboard's charts).

    `memory_bytes` is what the job's processes held, summed over all its GPUs (so compare
    it with `mem` x `gpus`); a point that stands for several polls holds their highest
    memory and their mean utilization (0-100, None where the driver gave none).
    """

    t: float  # epoch seconds
    memory_bytes: int | None
    utilization_pct: float | None

    def to_json(self) -> dict[str, Any]:
        from datetime import datetime, timezone  # only where timelines are shown

        from gpusched.core.clock import iso

        return {
            "t": iso(datetime.fromtimestamp(self.t, timezone.utc)),
            "memory": self.memory_bytes,
            "util": self.utilization_pct,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimelinePoint:
        from datetime import datetime

        memory, util = data.get("memory"), data.get("util")
        return cls(
            datetime.fromisoformat(str(data["t"])).timestamp(),
            None if memory is None else int(memory),
            None if util is None else float(util),
        )
