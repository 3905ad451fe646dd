"""What a supervisor's outcome means for its job: the final state and reason, in words.

Pure (endings.py's JobEndings.settle applies it): the state and reason of each
outcome other than a plain exit (`ENDINGS`) and of each stop the daemon asked for its own
reason (`STOPPED_FOR`), which ends' details are logged whatever `show_commands` says, the
stop intent of a version that kept it in `reason_detail`, and a run's end in a few words.
"""

from __future__ import annotations

from gpusched.core.models import EndReason, JobState, StopIntent
from gpusched.processes.launching import Outcome, OutcomeKind

# How a supervisor's outcome (other than a plain exit) ends a job; anything else is lost.
ENDINGS: dict[OutcomeKind, tuple[JobState, EndReason]] = {
    OutcomeKind.SIGNAL: (JobState.FAILED, EndReason.SIGNAL),
    OutcomeKind.CANCELLED: (JobState.CANCELLED, EndReason.CANCELLED),
    OutcomeKind.TIMEOUT: (JobState.FAILED, EndReason.TIMEOUT),
    OutcomeKind.FAILED_TO_START: (JobState.FAILED, EndReason.FAILED_TO_START),
    OutcomeKind.HOST_OOM: (JobState.FAILED, EndReason.HOST_OOM),
}

# How a job stopped by the daemon for a reason of its own ends (a plain cancel: cancelled).
STOPPED_FOR: dict[StopIntent, tuple[JobState, EndReason]] = {
    StopIntent.OVERRUN: (JobState.FAILED, EndReason.OVERRUN),
    StopIntent.TIMEOUT: (JobState.FAILED, EndReason.TIMEOUT),  # interactive jobs
    StopIntent.IDLE: (JobState.CANCELLED, EndReason.IDLE),  # interactive jobs
}

# Ends whose detail is gpusched's own words about public facts, logged whatever
# `show_commands` says (as gpusched.daemon.auth.PUBLIC_DETAILS shows them to everyone).
LOGGED_DETAILS = frozenset(
    {
        EndReason.SIGNAL,
        EndReason.CANCELLED,
        EndReason.DEPENDENCY_FAILED,
        EndReason.OVERRUN,
        EndReason.TIMEOUT,
        EndReason.HOST_OOM,
        EndReason.IDLE,
    }
)


def legacy_stop_intent(detail: str | None) -> tuple[StopIntent | None, str | None]:
    """The intent of a stop asked by a version that kept it as a prefix of `reason_detail`.

    Only for a job stopping across an upgrade (no `stop_intent` recorded yet). May be
    dropped in 0.3.0, once no job asked to stop by a 0.1.x daemon from before the
    `stop_intent` column can still be running.
    """
    if detail and detail.startswith("overrun: "):
        return StopIntent.OVERRUN, detail.removeprefix("overrun: ")
    if detail and detail.startswith("cancelled"):
        return StopIntent.CANCEL, detail
    return None, detail


def outcome_words(outcome: Outcome) -> str:
    """How a run ended, in a few words (a requeued run's attempt)."""
    if outcome.kind == OutcomeKind.EXIT:
        return f"exited {outcome.exit_code}"
    if outcome.kind == OutcomeKind.SIGNAL:
        return f"was killed by signal {outcome.signal}"
    if outcome.kind == OutcomeKind.CANCELLED:
        return "was stopped there"
    if outcome.kind == OutcomeKind.FAILED_TO_START:
        return "never started"
    return str(outcome.kind)
