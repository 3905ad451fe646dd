"""`gpusched history` as text: data in, lines out, no I/O.

Its STATE column names how each job ended, as sacct names TIMEOUT or OUT_OF_MEMORY
rather than FAILED: the job's `reason` where that says more than its state (`timeout`,
`oom`, `host_oom`, `signal`, `node_lost`, `dependency_failed`...), else its state
(`done`, `failed` for a non-zero exit, `cancelled`, `lost`), so the word is one of the
JSON's two fields, which `history --json` gives unchanged. RAN is how long it ran, as
its supervisor measured on the monotonic clock (`run_s`; for older rows ended_at -
started_at). Its command is shortened to
the terminal's width as `status` shortens it (cli/render.py `fit_words`), and every text
field passes through `sanitize` first.
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpusched.cli.render import fit_words, job_words, ran_for
from gpusched.cli.show_view import attempt_text, job_where, util_text
from gpusched.core.sanitize import shown_fields
from gpusched.core.units import format_duration, format_size

TYPE_CHECKING = False  # typing's own import costs every command
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpusched.core.models import Job

STATE_WIDTH = 10  # at least: "cancelled" and a space
# Reasons that say no more than the state of the job they end ("exit": its code does).
_PLAIN_REASONS = frozenset({"exit", "cancelled", "lost"})


def ended_as(job: Job) -> str:
    """How `job` ended, in one word: its reason where that says more than its state."""
    reason = job.reason
    return str(job.state) if reason is None or reason in _PLAIN_REASONS else str(reason)


def history_lines(jobs: Sequence[Job], width: int) -> list[str]:
    """The header and a line per job (and per earlier run of a requeued one), each at
    most `width` characters but for a command's shortest form."""
    jobs = [shown_fields(job) for job in jobs]
    words = [ended_as(job) for job in jobs]
    state_width = max(STATE_WIDTH, *(len(word) + 1 for word in words))
    lines = [
        f"{'ID':<6}{'USER':<11}{'STATE':<{state_width}}{'GPU':<6}{'MEM':>7}{'PEAK':>8}"
        f"{'UTIL':>6}{'RAN':>7}  {'ENDED':<20} COMMAND"
    ]
    now = datetime.now(timezone.utc)
    for job, word in zip(jobs, words, strict=True):
        mem = format_size(job.mem) if job.mem is not None else "whole"
        ended = (job.ended_at or "-")[:19].replace("T", " ")
        ran = ran_for(job, now)
        head = (
            f"{job.id:<6}{job.user[:10]:<11}{word:<{state_width}}{job_where(job):<6}{mem:>7}"
            f"{format_size(job.peak_mem):>8}{util_text(job.mean_util):>6}"
            f"{'-' if ran is None else format_duration(ran):>7}  {ended:<20} "
        )
        lines.append(head + fit_words(job_words(job), max(10, width - len(head))))
        for attempt in job.attempts or []:  # a requeued job's earlier runs
            lines.append(f"{'':<6}run {attempt['attempt']}: {attempt_text(attempt)}")
    return lines
