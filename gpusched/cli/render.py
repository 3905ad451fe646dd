"""`gpusched status` as text: data in, text out, no I/O.

`render_status()` is a pure function of the GPU and job lists, the terminal width, the
time and whether to colour; the CLI decides those (isatty, NO_COLOR, terminal size) and
prints the result. Colour is only decoration: without it every fact is still in the
characters (the memory bar uses a different character per segment), so the output reads
the same in a pipe, a log file or a terminal without colour. The GPUs' lines (bars,
figures, other users' processes, legend) are cli/render_gpus.py's; the jobs' are here.

Every text field (a job's name, command, user, reasons; a GPU's name and error; a drain's
reason) is passed through `sanitize.shown` first, and the columns are measured on what it
returns: a user's ESC, newline or bidi override is drawn as a visible escape, never
interpreted by the terminal, and cannot forge a row.

It reads jobs, GPUs, drains and nodes by attribute: the models' dataclasses (tests, the
API) or the views that cli/reply_view.py makes of a reply, so that `gpusched status`
draws without creating the dataclasses. A job's state is compared as its string. Imports
only the standard library, units and sanitize at start; click (for `click.style`) only
when colouring, the models only to type-check.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime, timezone

from gpusched.cli.render_gpus import Painter, clip, render_gpus
from gpusched.core.commands import script_index
from gpusched.core.sanitize import shown, shown_fields
from gpusched.core.units import format_duration, format_size

TYPE_CHECKING = False  # typing's own costs every `gpusched status` its import
if TYPE_CHECKING:
    from typing import TypeAlias

    from gpusched.cli.reply_view import ReplyView
    from gpusched.core.models import Drain, GpuReport, Job, NodeStatus

    JobLike: TypeAlias = Job | ReplyView
    GpuLike: TypeAlias = GpuReport | ReplyView

MIN_WIDTH = 60
NOTE_LINES = 3  # a waiting job's reason takes at most this many lines

# The states by their JSON names (core/models.py's JobState; tests/test_render.py checks
# that these agree with it): a JobState's hash is not its string's, so states are
# looked up as str(job.state).
RUNNING = "running"
WAITING_STATES = frozenset({"queued", "held"})
ENDED_STATES = frozenset({"done", "failed", "cancelled", "lost"})

_STATE_COLORS = {
    "running": "green",
    "queued": "yellow",
    "held": "cyan",
    "done": "green",
    "failed": "red",
    "cancelled": "yellow",
    "lost": "red",
}


def format_indices(indices: Sequence[int]) -> str:
    """[0, 1, 2, 3] -> "0-3"; [0, 2] -> "0,2"; [] -> "-"."""
    if not indices:
        return "-"
    ordered = sorted(indices)
    runs: list[list[int]] = [[ordered[0], ordered[0]]]
    for index in ordered[1:]:
        if index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)


def _seconds_since(moment: str | None, now: datetime) -> float | None:
    if not moment:
        return None
    try:
        then = datetime.fromisoformat(moment)
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return (now - then).total_seconds()


def ran_for(job: JobLike, now: datetime) -> float | None:
    """How long an ended job ran: as its supervisor measured on the monotonic clock, else
    (not recorded) ended_at - started_at, which a wall-clock jump distorts."""
    if job.run_s is not None:
        return float(job.run_s)
    ended = _seconds_since(job.ended_at, now)
    started = _seconds_since(job.started_at, now)
    return None if ended is None or started is None else started - ended


def job_words(job: JobLike) -> list[str]:
    """Its name, else its command's words; an array's job and an interactive job say so,
    which is all another user sees of them when commands are hidden."""
    if job.name:
        return [job.name]
    marks = []
    if job.array_id is not None:
        marks.append(f"a{job.array_id}[{job.array_index}]")
    if job.interactive:
        marks.append("(interactive)")
    return [*marks, *job.command]


def fit_words(words: Sequence[str], width: int) -> str:
    """The words joined, in `width` characters: a long path loses its directories first
    (".../train.py"), longest first, so the script's name stays in view; then the end
    is cut. The name of the script an interpreter runs is what tells one job from the
    next: where the cut would take it, the interpreter's name goes first ("z.py" for
    "python z.py"), and the cut spares it ("train.py+" where "..." would cover it)."""
    words = _short_paths(list(words), width)
    text = " ".join(words)
    script = script_index(words)
    if len(text) <= width or script is None:
        return clip(text, width)
    if len(" ".join(words[: script + 1])) > width - len("..."):
        del words[script - 1]
        script -= 1
        text = " ".join(words)
    kept = len(" ".join(words[: script + 1]))  # up to the script's name's end
    if len(text) <= width or kept <= width - len("..."):
        return clip(text, width)
    return text[:kept] + "+" if kept < width else clip(text, width)


def _short_paths(words: list[str], width: int) -> list[str]:
    """`words` with their paths cut to ".../NAME", longest first, until they fit."""
    text = " ".join(words)
    by_length = sorted(
        (i for i, word in enumerate(words) if "/" in word.rstrip("/")),
        key=lambda i: -len(words[i]),
    )
    for i in by_length:
        if len(text) <= width:
            break
        short = ".../" + words[i].rstrip("/").rsplit("/", 1)[1]
        if len(short) < len(words[i]):
            words[i] = short
            text = " ".join(words)
    return words


def _job_mem(job: JobLike) -> str:
    """Declared memory; for a running job what it holds now before it ("10.8G/4.0G": an
    overrun shows at a glance)."""
    mem = format_size(job.mem) if job.mem is not None else "whole"
    declared = mem if job.gpus == 1 else f"{job.gpus}x{mem}"
    if str(job.state) == RUNNING and job.mem_used is not None:
        return f"{format_size(job.mem_used)}/{declared}"
    return declared


def ended_label(job: JobLike) -> str:
    """How it ended, in a few words: "done exit 0", "failed exit 7", "cancelled",
    "failed (SIGKILL)", "failed (oom)"."""
    if job.reason in (None, "exit"):
        code = "" if job.exit_code is None else f" {job.exit_code}"
        return f"{job.state}{' exit' + code if code else ''}"
    if job.reason == "signal" and job.reason_detail:
        return f"{job.state} ({job.reason_detail})"
    return f"{job.state} ({job.reason})" if job.reason != str(job.state) else str(job.state)


def _job_lines(
    job: JobLike, now: datetime, width: int, paint: Painter, mem_width: int = 7
) -> list[str]:
    # TIME: running for, waiting for, or (ended) ran for.
    state = str(job.state)
    if state == RUNNING:
        since = _seconds_since(job.started_at, now)
    elif state in ENDED_STATES:
        since = ran_for(job, now)
    else:
        since = _seconds_since(job.submitted_at, now)
    elapsed = "-" if since is None else format_duration(since)
    head = (
        f"{job.id:>6}  {clip(job.user, 10, '+'):<10}  {format_indices(job.gpu_indices):<5}"
        f" {_job_mem(job):>{mem_width}}  {elapsed:>6}  "
    )
    room = max(10, width - len(head))
    words = job_words(job)
    color = _STATE_COLORS.get(state)
    if state in ENDED_STATES:
        label = ended_label(job)
        what = fit_words([f"{label}:", *words], room)
        what = paint(what[: len(label)], color) + what[len(label) :]
    else:
        what = fit_words(words, room)
    lines = [head + what]
    # Why it waits; or, running, what it should be told (an idle interactive job). Wrapped,
    # not cut: its end names the limit or the fix ("(max_mem 40G)").
    note = job.waiting_reason if state in WAITING_STATES else job.warning
    if note:
        indent = " " * 8
        wrapped = textwrap.wrap(note, width - len(indent)) or [""]
        if len(wrapped) > NOTE_LINES:
            wrapped = [
                *wrapped[: NOTE_LINES - 1],
                clip(" ".join(wrapped[NOTE_LINES - 1 :]), width - len(indent)),
            ]
        lines += [indent + paint(line, color) for line in wrapped]
    return lines


def render_jobs(
    jobs: Sequence[JobLike],
    now: datetime,
    width: int = 80,
    color: bool = False,
    show_all: bool = False,
    *,
    more_waiting: int = 0,
) -> list[str]:
    """`more_waiting`: waiting jobs beyond those in `jobs`, counted in the title and the
    last line of the waiting group (status lists the first few of a long queue)."""
    paint = Painter(color)
    jobs = [shown_fields(job) for job in jobs]
    running = [j for j in jobs if str(j.state) == RUNNING]
    waiting = [j for j in jobs if str(j.state) in WAITING_STATES]
    ended = [j for j in jobs if str(j.state) in ENDED_STATES]
    if not jobs:
        return ["no jobs" + ("" if show_all else " (--all shows recently ended ones)")]
    # As wide as its longest entry: "used/declared" only when a running job has a reading.
    mem_width = max(7, *(len(_job_mem(job)) for job in jobs))
    title = "USED/MEM" if mem_width > 7 else "MEM"
    lines = [
        paint(
            f"{'ID':>6}  {'USER':<10}  {'GPU':<5} {title:>{mem_width}}  {'TIME':>6}  COMMAND",
            bold=True,
        )
    ]
    groups: list[tuple[str, list[JobLike], str | None]] = [
        ("running", running, "green"),
        ("waiting", waiting, "yellow"),
    ]
    if show_all or ended:
        groups.append(("recently ended", ended, None))
    for title, members, tint in groups:
        if not members:
            continue
        extra = more_waiting if title == "waiting" else 0
        lines.append(paint(f"{title} ({len(members) + extra})", tint, bold=True))
        for job in members:
            lines.extend(_job_lines(job, now, width, paint, mem_width))
        if extra:
            lines.append(f"   ... and {extra} more waiting (--limit 0 lists all)")
    return lines


def render_status(
    gpus: Sequence[GpuLike],
    jobs: Sequence[JobLike],
    *,
    width: int = 80,
    color: bool = False,
    now: datetime | None = None,
    show_all: bool = False,
    drain: Drain | None = None,
    more_waiting: int = 0,
    nodes: Sequence[NodeStatus] = (),
) -> str:
    """The whole `gpusched status` screen, lines no wider than `width` (at least 60).

    `nodes`: in a cluster (more than one, or one not up), each node's line and its GPUs."""
    width = max(MIN_WIDTH, width)
    moment = now if now is not None else datetime.now(timezone.utc)
    lines = []
    if drain is not None:  # first: it explains why nothing in the queue starts
        text = (
            f"{shown_fields(drain).describe()}: no new job starts until an administrator"
            " lifts it; running jobs go on"
        )
        lines += [Painter(color)(line, "yellow", bold=True) for line in textwrap.wrap(text, width)]
        lines.append("")
    # One server (one node) is not a cluster: its drain is said above, in a server's words.
    if len(nodes) > 1:
        for node in nodes:
            heard = f"heard {format_duration(node.last_seen)} ago"
            lines.append(shown(f"node {node.name}: {node.state}, {heard}, {len(node.gpus)} GPU(s)"))
            lines += render_gpus(node.gpus, width, color) if node.gpus else []
    else:
        lines += render_gpus(gpus, width, color) if gpus else ["no GPUs"]
    lines.append("")
    lines.extend(render_jobs(jobs, moment, width, color, show_all, more_waiting=more_waiting))
    return "\n".join(lines)
