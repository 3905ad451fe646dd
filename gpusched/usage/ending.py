"""How a job ended, in figures: whether it ran out of GPU memory (`oom_cause`, from its
log and what the usage monitor saw) and the store columns written with its end, its
hints among them (`final_usage`). gpusched.usage.monitor watches jobs while they run;
this is what its figures say once a job has ended."""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpusched.core.hints import JobFacts, job_hints
from gpusched.core.models import Job
from gpusched.usage import oom
from gpusched.usage.joblog import read_tail
from gpusched.usage.monitor import UsageMonitor
from gpusched.usage.tracker import UsageTracker


@dataclass(frozen=True)
class OomCause:
    """Why a job ran out of GPU memory, in words, and whether a process gpusched did not
    start filled its card (`by_other`: then its retry keeps its --mem)."""

    text: str
    by_other: bool = False


def oom_cause(job: Job, tracker: UsageTracker | None, headroom_bytes: int) -> OomCause | None:
    """Why a job that failed ran out of GPU memory (gpusched.usage.oom), or None."""
    peak_mem = max(job.peak_mem or 0, 0 if tracker is None else tracker.peak_mem)
    last_card = None if tracker is None else oom.CardSeen.from_state(tracker.last_card)
    text = oom.oom_cause(
        # A log at the user's own path (--output) is read only if it is theirs.
        log_tail=read_tail(job.log_path, owner=job.uid if job.output else None),
        mem=job.mem,
        peak_mem=peak_mem,
        last_card=last_card,
        headroom_bytes=headroom_bytes,
    )
    if text is None:
        return None
    if (
        job.mem is None
        or last_card is None
        or not oom.filled_by_other(job.mem, peak_mem, last_card)
    ):
        return OomCause(text)
    owner = user_name(last_card.other_uid)
    return OomCause(f"{text}; {oom.other_words(last_card, owner, job.mem)}", by_other=True)


def user_name(uid: int | None) -> str:
    """A uid's user name, else "uid N" (no name here), else "unknown" (not read)."""
    if uid is None:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def final_usage(
    job: Job,
    tracker: UsageTracker,
    *,
    state: str,
    reason: str,
    ended_at: str,
    min_runtime_s: float,
    card_bytes: int | None,
    retry: Job | None = None,
    retry_refused: str | None = None,
    oom_next_mem: int | None = None,
    run_s: float | None = None,
) -> dict[str, Any]:
    """The store columns written with a job's end: its figures and its hints. `run_s`:
    how long it ran on its supervisor's monotonic clock, if known (else the wall clock's
    ended_at - started_at stands in, for the hints)."""
    runtime = run_s
    if runtime is None and job.started_at is not None:
        runtime = (
            datetime.fromisoformat(ended_at) - datetime.fromisoformat(job.started_at)
        ).total_seconds()
    summary = tracker.summary()
    facts = JobFacts(
        mem=job.mem,
        state=state,
        reason=reason,
        runtime_s=runtime,
        peak_mem=summary["peak_mem"],
        util_mean=tracker.util_mean,
        util_min=tracker.util_min,
        util_max=tracker.util_max,
        util_stddev=tracker.util_stddev,
        util_samples=tracker.util_samples,
        card_bytes=card_bytes,
        retried_as=None if retry is None else retry.id,
        retry_mem=None if retry is None else retry.mem,
        retry_refused=retry_refused,
        oom_next_mem=oom_next_mem,
        contended_fraction=tracker.sharing.contended_fraction(),
        shared_with=tuple(tracker.sharing.shared_with),
        shared_gpus=tuple(tracker.sharing.shared_gpus),
        sharing_speed=summary["sharing_speed"],
    )
    values = UsageMonitor.columns(tracker)
    values["peak_mem"] = summary["peak_mem"]
    values["hints"] = job_hints(facts, min_runtime_s)
    values["run_s"] = run_s
    return values
