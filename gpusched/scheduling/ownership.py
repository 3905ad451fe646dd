"""Which running jobs are this daemon's to settle, adopt and stop: a strategy.

`LocalNode`: one server, every job is its own. The cluster's `ClusterNode`
(scheduling.cluster.node) owns the jobs of its node, writes each end under the node's
epoch, and keeps the processes it started. `JobEndings` and `JobStarter` are handed one
at construction and never ask which kind it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpusched.core.models import Job
from gpusched.store import NodeGuard


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

    def started(self, job_id: int, pid: int, start_time: str | None) -> None:
        """A process was started (or adopted, after a restart) for a job."""

    def ended(self, job_id: int) -> None:
        """A job of this daemon's has ended."""


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

    def started(self, job_id: int, pid: int, start_time: str | None) -> None:
        pass

    def ended(self, job_id: int) -> None:
        pass
