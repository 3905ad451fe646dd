"""This daemon as one node of a cluster: who it is, the processes it started, its lease.

`Identity` is what the roles would otherwise read from the machine (host name, pid,
whether a pid is alive, a user's uid here): injected, so tests run two daemons' roles
in one process. `ClusterNode` is the ownership strategy (scheduling.ownership) that the
endings and the starter are handed: it owns the jobs of its node, writes their ends
under the node's epoch, claims each start under the node and epoch the cluster placed it
with (`PlacedClaim`), and keeps the processes started here, to stop those the cluster
gave to another node while this daemon was away. It also keeps the node's lease by the
monotonic clock: `launch_deadline`, the moment past which this node launches nothing
(read BEFORE a renewal is sent, plus node_timeout less election.fence_margin, advanced
only when that renewal's commit returns), which the starter checks after its claim and
hands to the job's supervisor, which refuses to exec past it.
"""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpusched.config.holder import ConfigHolder
from gpusched.core.models import Job, JobState
from gpusched.scheduling.cluster.election import fence_margin
from gpusched.scheduling.context import TickClock
from gpusched.store import NodeGuard, Placements, Store

# A user's uid and gid on this server.
Account = tuple[int, int]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_account(user: str) -> Account | None:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


@dataclass(frozen=True)
class Identity:
    host: str
    pid: int
    alive: Callable[[int], bool] = process_alive
    account: Callable[[str], Account | None] = local_account

    @classmethod
    def of_this_process(cls) -> Identity:
        return cls(socket.gethostname(), os.getpid())

    @property
    def owner(self) -> str:
        """How a node's row names the daemon holding it."""
        return f"{self.host}:{self.pid}"


@dataclass
class ClusterNode:
    name: str
    identity: Identity
    clock: TickClock
    settings: ConfigHolder
    epoch: int = 0
    # Processes started (or adopted) here: job id -> (epoch, pid, start time).
    local: dict[int, tuple[int, int, str | None]] = field(default_factory=dict)
    renewed_at: float | None = None  # monotonic time of the last renewal
    # Monotonic time past which this node launches nothing (None: never renewed).
    launch_deadline: float | None = None
    steady_since: float = 0.0  # renewing without a gap since (monotonic)
    recheck_s: float | None = 1.0  # ends written by other daemons notify nobody here

    # -- ownership ------------------------------------------------------------------------

    def owns(self, job: Job) -> bool:
        return job.node == self.name

    def guard_for(self, job_id: int) -> NodeGuard:
        started = self.local.get(job_id)
        return NodeGuard(self.name, started[0] if started else self.epoch)

    def client_here(self, job: Job) -> bool:
        # An interactive job may run only where its client is (handlers/interactive.py
        # restricts it to that node); once running, it is on that node.
        if job.state == JobState.RUNNING:
            return self.owns(job)
        return job.allowed_nodes is not None and self.name in job.allowed_nodes

    def start_claim(
        self, store: Store, clock: TickClock, guard: NodeGuard | None = None
    ) -> PlacedClaim:
        """Each write conditioned on `guard` (None: this node at its current epoch)."""
        placed_under = guard if guard is not None else NodeGuard(self.name, self.epoch)
        return PlacedClaim(store.placements, placed_under)

    def started(self, job_id: int, pid: int, start_time: str | None) -> None:
        self.local[job_id] = (self.epoch, pid, start_time)

    def ended(self, job_id: int) -> None:
        self.local.pop(job_id, None)

    def process_of(self, job_id: int) -> tuple[int, str | None] | None:
        held = self.local.get(job_id)
        return None if held is None else (held[1], held[2])

    # -- the lease ------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return self.settings.current.node_timeout_s

    @property
    def margin_s(self) -> float:
        """How long before its lease runs out a node stops launching, and how long past it
        the scheduler waits before declaring the node down (election.fence_margin)."""
        config = self.settings.current
        return fence_margin(config.node_timeout_s, config.poll_interval_s)

    def renewed(self, epoch: int, sent_at: float | None = None) -> None:
        """The lease was taken or renewed at `epoch`, by a write sent at `sent_at` (the
        monotonic time read before sending it; None: now) whose commit has returned. The
        database's lease runs from its own clock at the commit, later than `sent_at`: a
        deadline counted from `sent_at` ends no later than that lease, less the margin."""
        now = self.clock.monotonic()
        if self.is_fenced():  # joined, or back from a gap (the database away, a pause)
            self.steady_since = now
        self.epoch = epoch
        self.renewed_at = now
        start = now if sent_at is None else sent_at
        self.launch_deadline = start + self.timeout_s - self.margin_s

    def is_fenced(self) -> bool:
        """Past this node's launch deadline: it must start nothing."""
        deadline = self.launch_deadline
        return deadline is None or self.clock.monotonic() >= deadline

    def steady_for(self) -> float:
        """Seconds this daemon has renewed its lease without a gap (since it joined, or
        since it came back from being unable to): the scheduler declares no node down
        before this reaches node_timeout, since the others may be coming back too."""
        return self.clock.monotonic() - self.steady_since


@dataclass(frozen=True)
class PlacedClaim:
    """The start of a job the cluster placed on this node: each write conditioned on the
    node and epoch it was placed under (`guard`), so a node fenced or declared down since
    can neither take it nor record its launch (store.placements)."""

    placements: Placements
    guard: NodeGuard

    def take(
        self, job_id: int, indices: Sequence[int], uuids: Sequence[str], log_path: str | None
    ) -> bool:
        """The GPUs are the placement's, in the row already."""
        return self.placements.mark_running_placed(job_id, self.guard, log_path)

    def take_client(
        self,
        job_id: int,
        indices: Sequence[int],
        uuids: Sequence[str],
        client: tuple[int, str | None],
    ) -> bool:
        return self.placements.mark_running_placed(job_id, self.guard, None, pid=client)

    def give_back(self, job_id: int) -> None:
        self.placements.unclaim(job_id, self.guard)

    def launched(self, job_id: int, pid: int, start_time: str) -> None:
        # started_at: the launch, by the database's clock (not the claim's)
        self.placements.launched(job_id, self.guard, pid, start_time)
