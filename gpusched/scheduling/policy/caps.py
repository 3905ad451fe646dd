"""Each user's caps (`limits:` max_running, max_mem) and what counts against them.

What the caps count is kept in one `Tallies` for the plan: each user's running jobs and
declared GPU memory (`claimed_bytes`: a whole GPU counts as its total), and each array's
running jobs (for the array cap), the running jobs' first and then each placement's. A
job its owner's `max_running` holds back waits and claims no card; one that would pass
`max_mem` on the cards chosen for it waits, and claims none either. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.units import format_size
from gpusched.scheduling.policy.budget import PlanGpu, RunningClaim
from gpusched.scheduling.policy.data import UserCap, WaitingJob


def claimed_bytes(mem_bytes: int | None, gpus: Sequence[PlanGpu]) -> int:
    """Declared memory a job holds over its GPUs; a whole GPU counts as its total."""
    return sum(g.slot.total_bytes if mem_bytes is None else mem_bytes for g in gpus)


@dataclass
class Tallies:
    """What the caps count, as a plan goes: per user and per array."""

    user_running: dict[str, int]
    user_bytes: dict[str, int]
    array_running: dict[int, int]

    @classmethod
    def of(cls, running: Sequence[RunningClaim], by_uuid: Mapping[str, PlanGpu]) -> Tallies:
        """The running jobs' tallies."""
        tallies = cls({}, {}, {})
        for claim in running:
            on = [by_uuid[u] for u in claim.gpu_uuids if u in by_uuid]
            tallies.count(claim.user, claim.array_id, claimed_bytes(claim.mem_bytes, on))
        return tallies

    def count(self, user: str, array_id: int | None, held_bytes: int) -> None:
        """One more job of `user` (and of `array_id`), holding `held_bytes`."""
        self.user_running[user] = self.user_running.get(user, 0) + 1
        self.user_bytes[user] = self.user_bytes.get(user, 0) + held_bytes
        if array_id is not None:
            self.array_running[array_id] = self.array_running.get(array_id, 0) + 1

    def held_bytes(self, user: str) -> int:
        return self.user_bytes.get(user, 0)


def running_cap_reason(job: WaitingJob, cap: UserCap | None, tallies: Tallies) -> str | None:
    """Why `job` waits for its owner's `max_running`; None: it does not."""
    if cap is None or cap.max_running is None:
        return None
    count = tallies.user_running.get(job.user, 0)
    if count < cap.max_running:
        return None
    return f"user limit: {job.user} has {count} running (max_running {cap.max_running})"


def over_mem_cap(
    job: WaitingJob, cap: UserCap | None, held_bytes: int, chosen: Sequence[PlanGpu]
) -> str | None:
    """Why `job` on `chosen` would pass its owner's `max_mem`; None: it would not."""
    if cap is None or cap.max_mem_bytes is None:
        return None
    wanted = claimed_bytes(job.mem_bytes, chosen)
    if held_bytes + wanted <= cap.max_mem_bytes:
        return None
    return (
        f"user limit: {job.user} holds {format_size(held_bytes)} of GPU memory and this job"
        f" needs {format_size(wanted)} (max_mem {format_size(cap.max_mem_bytes)})"
    )
