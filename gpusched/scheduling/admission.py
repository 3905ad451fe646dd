"""The first of the shared pass rules (pass_rules.py): which queued jobs may be planned, by
their `--after` dependencies.

`admit()` reads only: it returns the jobs whose dependencies all succeeded, a waiting
reason for each job whose dependencies are still active, and the jobs that can never run
because a dependency failed (the placers end those as `dependency_failed`). A
dependency that ran out of memory and was retried is its latest attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

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
        failed = [
            d
            for d in job.after
            if d in deps and deps[d].state in TERMINAL_STATES and deps[d].state != JobState.DONE
        ]
        pending = [d for d in job.after if d in deps and deps[d].state not in TERMINAL_STATES]
        if failed:
            dep = deps[failed[0]]
            result.doomed.append(
                DependencyFailed(job.id, f"job {dep.id} ended {dep.state} ({dep.reason})")
            )
        elif pending:
            result.waiting_reasons[job.id] = "waiting for job " + ", ".join(
                _attempt(d, deps[d]) for d in pending
            )
        else:
            eligible.append(job)
    return result


def _attempt(dep_id: int, latest: Job) -> str:
    """A dependency as the user named it, and its retry when it ran out of memory."""
    if latest.id == dep_id:
        return str(dep_id)
    return f"{dep_id} (out of GPU memory, retried as job {latest.id})"
