"""`gpusched show`: what it asks and what it prints about one job, shared by the click
command (cli/views.py) and the fast path (cli/fast.py), so both print the same.

Drawn from the daemon's reply as JSON (the job's fields through cli/job_json.py, read by
attribute through cli/reply_view.py's ReplyView with its text escaped; the timeline's
points as `TimelineView`), not from the models' dataclasses: `gpusched show` starts
without creating them, at interpreter speed. Neither click, the client, the models nor typing is
imported here at run time; tests/test_cli_fast.py checks the frame and the JSON against
the models' and the request's.
"""

from __future__ import annotations

import json
import sys

from gpusched.cli.job_json import job_json
from gpusched.cli.reply_view import ReplyView
from gpusched.core.after import after_text
from gpusched.core.sanitize import shown
from gpusched.core.units import format_duration, format_size

TYPE_CHECKING = False  # typing's own import costs every `gpusched show`
if TYPE_CHECKING:
    from typing import Any

    from gpusched.core.models import Job

LABEL_WIDTH = 11  # `show`'s values start here ("exit code: 0")


def show_wire(job_id: int) -> dict[str, Any]:
    """The frame `show` sends: `ShowRequest(job_id, timeline=True).to_wire()` without its op,
    its id checked as ShowRequest checks it (NotFoundError under 1)."""
    from gpusched.core.requests.checks import job_id as check_job_id

    check_job_id(job_id)
    return {"id": job_id, "timeline": True}


class TimelineView:
    """One point of a reply's timeline, as core/models.py's TimelinePoint reads it
    (`from_json`) and writes it (`to_json`), without the dataclass."""

    __slots__ = ("memory_bytes", "t", "utilization_pct")

    def __init__(self, data: dict[str, Any]) -> None:
        from datetime import datetime

        memory, util = data.get("memory"), data.get("util")
        self.t = datetime.fromisoformat(str(data["t"])).timestamp()
        self.memory_bytes = None if memory is None else int(memory)
        self.utilization_pct = None if util is None else float(util)

    def to_json(self) -> dict[str, Any]:
        from datetime import datetime, timezone

        from gpusched.core.clock import iso

        return {
            "t": iso(datetime.fromtimestamp(self.t, timezone.utc)),
            "memory": self.memory_bytes,
            "util": self.utilization_pct,
        }


def _timeline(reply: dict[str, Any]) -> list[TimelineView]:
    return [TimelineView(point) for point in reply.get("timeline") or []]


def show_json(reply: dict[str, Any]) -> str:
    """`show --json`: the job (the JOB object) and its timeline."""
    value = {**job_json(reply), "timeline": [p.to_json() for p in _timeline(reply)]}
    for key in EXPECTED_KEYS:  # a waiting job's expected demand, when history gives one
        if key in reply:
            value[key] = reply[key]
    return json.dumps(value, indent=2, sort_keys=False)


def show_lines(reply: dict[str, Any], width: int) -> list[str]:
    """`show`'s lines for a terminal `width` columns wide (users' text escaped)."""
    job = ReplyView(job_json(reply), {})
    timeline = _timeline(reply)
    rows: list[tuple[str, Any]] = [
        ("id", job.id),
        ("name", job.name or "-"),
        ("user", f"{job.user} (uid {job.uid})"),
        ("state", job.state),
        ("command", " ".join(job.command)),
        ("cwd", job.cwd),
        ("mem", f"{format_size(job.mem)} per GPU" if job.mem else "a whole GPU"),
        ("gpus", f"{job.gpus} (indices {job_where(job)})"),
        *([("ram", f"{format_size(job.ram, tabular=False)} of host memory")] if job.ram else []),
        *([("cpus", f"{job.cpus} core(s) of its own")] if job.cpus else []),
        ("priority", job.priority),
        ("after", after_text(job.after, job.after_when)),
        ("submitted", job.submitted_at),
        ("started", job.started_at or "-"),
        ("ended", job.ended_at or "-"),
        *([("ran", format_duration(job.run_s))] if job.run_s is not None else []),
        *host_used_rows(job),
        ("pid", job.pid or "-"),
        ("exit code", "-" if job.exit_code is None else job.exit_code),
        (
            "reason",
            f"{job.reason}: {job.reason_detail}" if job.reason_detail else job.reason or "-",
        ),
        *usage_rows(job),
        *expected_rows(reply),
        (
            "log",
            job.log_path or _no_log(job),
        ),
    ]
    if job.warning:
        rows.append(("warning", job.warning))
    if job.notify:
        import shlex

        rows.append(("notify", shlex.join(job.notify)))  # as it was given: quotes kept
        if job.notify_result is not None:
            rows.append(("notify ran", notify_outcome(job.notify_result)))
    for attempt in job.attempts or []:
        rows.append((f"run {attempt['attempt']}", attempt_text(attempt)))
    if job.waiting_reason:
        rows.insert(4, ("waiting", job.waiting_reason))
    if "expected_start" in reply:  # a waiting job's, from a daemon that says
        rows.insert(
            5 if job.waiting_reason else 4, ("expected start", _when(reply["expected_start"]))
        )
    from gpusched.cli.sparkline import glyphs_for, render_timeline

    return [
        *labelled(rows),
        *render_timeline(
            timeline,
            declared_bytes=job.mem,
            gpus=job.gpus,
            width=width,
            glyphs=glyphs_for(sys.stdout.encoding),
        ),
        *(f"{'hint:':<{LABEL_WIDTH}}{hint}" for hint in job.hints),
    ]


def _no_log(job: ReplyView) -> str:
    """The log line of a job without a log: why there is none, where the daemon said."""
    if job.interactive:
        return "- (interactive: output to its terminal)"
    return f"- (log removed: {job.log_removed})" if job.log_removed else "-"


def job_where(job: Job | ReplyView) -> str:
    if job.gpu_indices:
        return ",".join(map(str, job.gpu_indices))
    return "-"


def labelled(rows: list[tuple[str, Any]]) -> list[str]:
    """`show`'s "label: value" lines: values start in column LABEL_WIDTH, as the sparklines'
    below; a longer label keeps a space after its colon ("retried as: job 32")."""
    return [
        f"{key + ':':<{LABEL_WIDTH}}{value}" if len(key) + 2 <= LABEL_WIDTH else f"{key}: {value}"
        for key, value in rows
    ]


def notify_outcome(result: dict[str, Any]) -> str:
    """How a --notify hook ended, in one line: "exited 127: sh: 1: mail: not found"."""
    kind, code = result.get("kind"), result.get("exit_code")
    if kind == "timeout":
        said = "killed at hook_timeout"
    elif kind == "failed_to_start":
        said = "could not start"
    elif code == 0:
        said = "exited 0"
    else:
        said = f"exited {code}"
    output = " | ".join(line for line in str(result.get("output") or "").splitlines() if line)
    return shown(f"{said}: {output}" if output else said)


def attempt_text(attempt: dict[str, Any]) -> str:
    """An earlier run of a requeued job, on one line (sanitized: a node's name is an
    administrator's, the outcome the daemon's words)."""
    started = (attempt.get("started_at") or "-")[:19].replace("T", " ")
    ended = (attempt.get("ended_at") or "-")[:19].replace("T", " ")
    return shown(
        f"node {attempt.get('node') or '-'}, {started} to {ended}: {attempt.get('outcome')}"
    )


def _when(moment: Any) -> str:
    """An expected start as `show` prints it: "2026-11-26 10:27:10 UTC", or "unknown"."""
    if not isinstance(moment, str) or not moment:
        return "unknown"
    return moment[:19].replace("T", " ") + " UTC"


def util_text(percent: float | None) -> str:
    return "-" if percent is None else f"{percent:.0f}%"


# `show`'s reply for a waiting job: its expected demand from history, and of how many of
# its owner's latest runs (0: its own earlier runs); when it is expected to start (null:
# unknown; scheduling.expected_start).
EXPECTED_KEYS = ("expected_demand", "expected_from_owner_runs", "expected_start")


def expected_rows(reply: dict[str, Any]) -> list[tuple[str, Any]]:
    """A waiting job's "gpu demand" line: what rule 3 counts it as, and from what."""
    demand = reply.get("expected_demand")
    if not isinstance(demand, (int, float)):
        return []
    kind = "busy" if demand >= 0.5 else "light"
    runs = reply.get("expected_from_owner_runs") or 0
    if not runs:
        measured = ", as measured: --share does not make it light" if reply.get("share") else ""
        return [
            (
                "gpu demand",
                f"expected {demand:.2f} of a GPU's busy time (its earlier runs{measured})",
            )
        ]
    other = "--share" if kind == "busy" else "--exclusive"
    return [
        (
            "gpu demand",
            f"expected {kind}, {demand:.2f} of a GPU's busy time: its owner's last {runs}"
            f" jobs were {kind}, and it has no runs of its own yet ({other} if it is not)",
        )
    ]


def usage_rows(job: Job | ReplyView) -> list[tuple[str, Any]]:
    """`show`'s lines about what the job used, beside what it declared."""
    declared = f"declared {format_size(job.mem)} per GPU" if job.mem else "declared a whole GPU"
    rows: list[tuple[str, Any]] = [("peak mem", f"{format_size(job.peak_mem)} ({declared})")]
    if job.mean_util is None:
        rows.append(("gpu util", "-"))
    else:
        spread = f", {util_text(job.util_min)}-{util_text(job.util_max)}"
        if job.util_stddev is not None:
            spread += f" (sd {job.util_stddev:.0f})"
        rows.append(("gpu util", f"{util_text(job.mean_util)} on average{spread}"))
    if job.demand is not None:
        # What the policy counts it as: the measurement, whatever --share said.
        counted = (
            " (measured busy: counted so, --share or not)"
            if job.share and job.demand >= 0.5
            else ""
        )
        rows.append(("gpu demand", f"{job.demand:.2f} of a GPU's busy time{counted}"))
    if job.sharing_speed is not None:  # else no note: hints.py (a dataclass) stays unloaded
        from gpusched.core.hints import sharing_note

        note = sharing_note(job.sharing_speed, job.gpu_indices, job.shared_with or ())
        if note is not None:
            rows.append(("sharing", note))
    if job.overrun_at:
        rows.append(("overrun", f"over its declared memory since {job.overrun_at}"))
    if job.retry_of is not None:
        rows.append(("retry of", f"job {job.retry_of} (ran out of GPU memory)"))
    if job.retried_as is not None:
        rows.append(("retried as", f"job {job.retried_as}"))
    if job.retry_oom and job.retried_as is None:  # a retry used is the retry's to count
        rows.append(("retry-oom", f"{job.retry_oom} more time(s) if it runs out of GPU memory"))
    return rows


def host_used_rows(job: Job | ReplyView) -> list[tuple[str, Any]]:
    """What an ended job used of the host, where its supervisor measured it."""
    rows: list[tuple[str, Any]] = []
    if job.host_peak is not None:
        rows.append(("host peak", f"{format_size(job.host_peak, tabular=False)} of host memory"))
    if job.cpu_s is not None:
        cores = f" (on average {job.cpu_s / job.run_s:.1f} cores)" if job.run_s else ""
        spent = f"{job.cpu_s:.1f}s" if job.cpu_s < 60 else format_duration(job.cpu_s)
        rows.append(("cpu time", f"{spent}{cores}"))
    return rows
