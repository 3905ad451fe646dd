"""The first of the shared pass rules (pass_rules.py): which queued jobs may be planned, by
their `--after` dependencies.

`admit()` reads only: it returns the jobs whose dependencies all ended as each asks
(`ok`: succeeded, the default; `any`: ended, however; `failed`: ended without
succeeding), a waiting reason for each job whose dependencies are still active, and the
jobs that can never run because a dependency ended otherwise (the placers end those as
`dependency_failed`). A dependency that ran out of memory and was retried is its latest
attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gpusched.core.after import AFTER_ANY, AFTER_FAILED, AFTER_OK
from gpusched.core.models import TERMINAL_STATES, Job, JobState
from gpusched.scheduling.last_answer import LastAnswer
from gpusched.store import Queued


@dataclass(frozen=True)
class DependencyFailed:
    job_id: int
    detail: str  # which dependency ended how, for the job's `reason_detail`


@dataclass
class Admission:
    # Read only (the store's own tuple when nothing was held back); replaced, not changed.
    eligible: Sequence[Queued] = field(default_factory=list)
    waiting_reasons: dict[int, str] = field(default_factory=dict)
    doomed: list[DependencyFailed] = field(default_factory=list)


_after = attrgetter("after")


# The jobs with `--after` of the queue last asked about (scheduling.last_answer).
_dependent: LastAnswer[Queued, list[Queued]] = LastAnswer(lambda q: list(filter(_after, q)))


def admit(
    queued: Sequence[Queued], latest_attempts: Callable[[Iterable[int]], dict[int, Job]]
) -> Admission:
    dependent = _dependent(queued)  # a C loop, once per queue: most jobs have no --after
    if not dependent:
        return Admission(eligible=queued)
    eligible: list[Queued] = []
    result = Admission(eligible=eligible)
    needed = {dep for job in dependent for dep in job.after}
    deps = latest_attempts(needed) if needed else {}
    for job in queued:
        if not job.after:  # most jobs: nothing to look up
            eligible.append(job)
            continue
        doomed, pending = _unmet(job, deps)
        if doomed is not None:
            result.doomed.append(DependencyFailed(job.id, doomed))
        elif pending:
            result.waiting_reasons[job.id] = "waiting for job " + ", ".join(pending)
        else:
            eligible.append(job)
    return result


# What a waiting reason adds to a dependency's id, by its condition (`ok`: nothing).
_WAITING_FOR = {AFTER_OK: "", AFTER_ANY: " (to end)", AFTER_FAILED: " (to fail)"}


def _unmet(job: Queued, deps: dict[int, Job]) -> tuple[str | None, list[str]]:
    """Why `job` can never run (the first of its conditions that can no longer hold,
    for its `reason_detail`), else None and its dependencies still to end, as its waiting
    reason names them. A dependency not found (forgotten by retention) holds nothing up."""
    pending: list[str] = []
    conditions = job.after_when or [AFTER_OK] * len(job.after)
    for dep_id, when in zip(job.after, conditions, strict=True):
        latest = deps.get(dep_id)
        if latest is None:
            continue
        if latest.state not in TERMINAL_STATES:
            pending.append(_attempt(dep_id, latest) + _WAITING_FOR.get(when, ""))
            continue
        succeeded = latest.state == JobState.DONE
        ended = f"job {latest.id} ended {latest.state} ({latest.reason})"
        if when == AFTER_FAILED and succeeded:
            return f"{ended}: --after {dep_id}:failed starts it only if that job fails", []
        if when not in (AFTER_ANY, AFTER_FAILED) and not succeeded:
            return ended, []
    return None, pending


def _attempt(dep_id: int, latest: Job) -> str:
    """A dependency as the user named it, and its retry when it ran out of memory."""
    if latest.id == dep_id:
        return str(dep_id)
    return f"{dep_id} (out of GPU memory, retried as job {latest.id})"
