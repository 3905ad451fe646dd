"""Which running jobs are this daemon's to settle, adopt and stop, and how its starts
hold their jobs' rows: a strategy.

`LocalNode`: one server, every job is its own; a start marks its job running and records
its process unconditionally (`LocalClaim`). The cluster's `ClusterNode`
(scheduling.cluster.node) owns the jobs of its node, writes each end under the node's
epoch, keeps the processes it started, and claims each start under the node and epoch
the cluster placed it with. `JobEndings` and `JobStarter` are handed one at construction
and never ask which kind it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpusched.core.clock import iso
from gpusched.core.models import Job
from gpusched.scheduling.context import TickClock
from gpusched.store import Jobs, NodeGuard, Store


class StartClaim(Protocol):
    """How a start holds its job's row: taken before anything runs (a restart then looks
    for the job's supervisor instead of starting it twice), given back when the launch
    may not happen after all, completed with the process launched."""

    def take(
        self, job_id: int, indices: Sequence[int], uuids: Sequence[str], log_path: str | None
    ) -> bool:
        """Mark a job running on these GPUs before its process is launched: False if the
        store refused (the job changed, or in a cluster the node was fenced or declared
        down)."""

    def take_client(
        self,
        job_id: int,
        indices: Sequence[int],
        uuids: Sequence[str],
        client: tuple[int, str | None],
    ) -> bool:
        """Mark an interactive job running on these GPUs, its client (pid, start time)
        its process: nothing is launched for it. False as for `take`."""

    def give_back(self, job_id: int) -> None:
        """A job taken but not launched goes back to the queue."""

    def launched(self, job_id: int, pid: int, start_time: str) -> None:
        """A taken job's process was launched: its pid and start time."""


class Ownership(Protocol):
    @property
    def name(self) -> str:
        """This server's name, recorded with each start ("" for none)."""

    @property
    def recheck_s(self) -> float | None:
        """How often a waiter reads the ends again (None: when notified; in a cluster
        another daemon may record an end, which notifies nobody here)."""

    def owns(self, job: Job) -> bool:
        """Whether a running row is this daemon's to settle and adopt."""

    def guard_for(self, job_id: int) -> NodeGuard | None:
        """The node and epoch an end write must still match (None: unconditional)."""

    def client_here(self, job: Job) -> bool:
        """Whether an interactive job's client runs on this server (its pid means
        something only here)."""

    @property
    def launch_deadline(self) -> float | None:
        """The monotonic time past which this server may launch nothing (None: no
        deadline; a cluster node's lease less its margin, scheduling.cluster.node)."""

    def start_claim(
        self, store: Store, clock: TickClock, guard: NodeGuard | None = None
    ) -> StartClaim:
        """How a start holds its job's row (`guard`: the node and epoch the cluster placed
        the job under; None: this server as it is now)."""

    def started(self, job_id: int, pid: int, start_time: str | None) -> None:
        """A process was started (or adopted, after a restart) for a job."""

    def ended(self, job_id: int) -> None:
        """A job of this daemon's has ended."""

    def process_of(self, job_id: int) -> tuple[int, str | None] | None:
        """The process (pid, start time) this daemon runs the job's current run in, as
        it keeps it (None: not kept)."""


@dataclass(frozen=True)
class LocalNode:
    """One server: every job is its own, every end written unconditionally."""

    name: str = ""
    recheck_s: float | None = None
    launch_deadline: float | None = None

    def owns(self, job: Job) -> bool:
        return True

    def guard_for(self, job_id: int) -> NodeGuard | None:
        return None

    def client_here(self, job: Job) -> bool:
        return True

    def start_claim(
        self, store: Store, clock: TickClock, guard: NodeGuard | None = None
    ) -> StartClaim:
        """Every start unconditional: one server has no guard to match."""
        return LocalClaim(store.jobs, clock, self.name or None)

    def started(self, job_id: int, pid: int, start_time: str | None) -> None:
        pass

    def ended(self, job_id: int) -> None:
        pass

    def process_of(self, job_id: int) -> tuple[int, str | None] | None:
        return None  # one server runs a job again only after its run's end is recorded


@dataclass(frozen=True)
class LocalClaim:
    """One server's starts: its job rows written unconditionally, `node` recorded with
    each (None: the server has no name)."""

    jobs: Jobs
    clock: TickClock
    node: str | None

    def take(
        self, job_id: int, indices: Sequence[int], uuids: Sequence[str], log_path: str | None
    ) -> bool:
        if not self._mark(job_id, indices, uuids, None, log_path):
            return False
        # The claim took the job out of the queue in one committed write: the next
        # pass's queued() need not read the queue again for it (store.queue_marks).
        self.jobs.left_queue([job_id])
        return True

    def take_client(
        self,
        job_id: int,
        indices: Sequence[int],
        uuids: Sequence[str],
        client: tuple[int, str | None],
    ) -> bool:
        return self._mark(job_id, indices, uuids, client, None)

    def give_back(self, job_id: int) -> None:
        self.jobs.unmark_running(job_id)

    def launched(self, job_id: int, pid: int, start_time: str) -> None:
        self.jobs.set_pid(job_id, pid, start_time)

    def _mark(
        self,
        job_id: int,
        indices: Sequence[int],
        uuids: Sequence[str],
        client: tuple[int, str | None] | None,
        log_path: str | None,
    ) -> bool:
        pid, pid_start_time = client if client is not None else (None, None)
        return self.jobs.mark_running(
            job_id,
            gpu_indices=indices,
            gpu_uuids=uuids,
            pid=pid,
            pid_start_time=pid_start_time,
            log_path=log_path,
            now=iso(self.clock()),
            node=self.node,
        )
