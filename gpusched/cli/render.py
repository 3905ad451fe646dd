"""`gpusched status` as text: data in, text out, no I/O.

`render_status()` is a pure function of the GPU and job lists, the terminal width, the
time and whether to colour; the CLI decides those (isatty, NO_COLOR, terminal size) and
prints the result. Colour is only decoration: without it every fact is still in the
characters (the memory bar uses a different character per segment), so the output reads
the same in a pipe, a log file or a terminal without colour.

Every text field (a job's name, command, user, reasons; a GPU's name and error; a drain's
reason) is passed through `sanitize.shown` first, and the columns are measured on what it
returns: a user's ESC, newline or bidi override is drawn as a visible escape, never
interpreted by the terminal, and cannot forge a row.

It reads jobs, GPUs, drains and nodes by attribute: the models' dataclasses (tests, the
API) or the views that cli/status_view.py makes of a reply, so that `gpusched status`
draws without creating the dataclasses. A job's state is compared as its string. Imports
only the standard library, units and sanitize at start; click (for `click.style`) only
when colouring, the models only to type-check.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime, timezone

from gpusched.core.sanitize import shown, shown_fields
from gpusched.core.units import format_duration, format_size

TYPE_CHECKING = False  # typing's own costs every `gpusched status` its import
if TYPE_CHECKING:
    from typing import TypeAlias

    from gpusched.cli.status_view import ReplyView
    from gpusched.core.models import Drain, GpuReport, Job, NodeStatus

    JobLike: TypeAlias = Job | ReplyView
    GpuLike: TypeAlias = GpuReport | ReplyView

MIN_WIDTH = 60
MIN_BAR = 8
MAX_BAR = 50
NOTE_LINES = 3  # a waiting job's reason takes at most this many lines

# One character per memory segment, so the bar reads without colour too.
BAR_JOBS = "#"
BAR_OTHERS = "%"
BAR_RESERVED = "+"
BAR_FREE = "."

_SEGMENT_COLORS = {
    BAR_JOBS: "green",
    BAR_OTHERS: "magenta",
    BAR_RESERVED: "yellow",
    BAR_FREE: None,
}

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


class _Painter:
    """click.style when colouring, identity otherwise."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, fg: str | None = None, **styles: bool) -> str:
        if not self.color or (fg is None and not styles):
            return text
        import click  # on a terminal only: a pipe's `status` starts without it

        return click.style(text, fg=fg, **styles)


def split_cells(values: Sequence[int], cells: int) -> list[int]:
    """Share `cells` characters among `values` in proportion, every non-zero value getting
    at least one cell when there are enough cells; the counts always sum to `cells`."""
    total = sum(max(0, v) for v in values)
    if cells <= 0:
        return [0] * len(values)
    if total <= 0:
        return [0] * (len(values) - 1) + [cells]
    # Cumulative rounding: the boundaries fall where the bytes do, and the sum is exact.
    counts = []
    running = 0
    previous = 0
    for value in values:
        running += max(0, value)
        boundary = round(running * cells / total)
        counts.append(boundary - previous)
        previous = boundary
    # A sliver (e.g. 300M of another user's process on an 80G card) must still show.
    for i, value in enumerate(values):
        if value > 0 and counts[i] == 0:
            donor = max(range(len(counts)), key=lambda j: counts[j])
            if counts[donor] > 1:
                counts[donor] -= 1
                counts[i] = 1
    return counts


def memory_bar(gpu: GpuLike, cells: int, paint: _Painter) -> str:
    """[###%%++......]: gpusched jobs, other processes, reserved for jobs, free."""
    jobs = max(0, gpu.used_by_jobs)
    others = max(0, gpu.used_by_others)
    reserved = max(0, gpu.reserved)
    free = max(0, gpu.total - jobs - others - reserved)
    counts = split_cells([jobs, others, reserved, free], cells)
    parts = [
        paint(char * count, _SEGMENT_COLORS[char], **({"dim": True} if char == BAR_FREE else {}))
        for char, count in zip((BAR_JOBS, BAR_OTHERS, BAR_RESERVED, BAR_FREE), counts, strict=True)
        if count
    ]
    return "[" + "".join(parts) + "]"


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


def _clip(text: str, width: int, marker: str = "...") -> str:
    """`text` cut to `width` characters, ending with `marker` when cut."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - len(marker)] + marker if width > len(marker) else text[:width]


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


def _gpu_columns(width: int) -> tuple[int, int]:
    """(name width, bar cells) for a terminal `width` columns wide."""
    name = 20 if width >= 100 else 14 if width >= 80 else 10
    # index 3, spaces, name, [bar], used/total 13, available 10, util 5
    bar = width - (3 + 1 + name + 1 + 2 + 14 + 10 + 5) - 1
    return name, min(MAX_BAR, max(MIN_BAR, bar))


def render_gpus(gpus: Sequence[GpuLike], width: int = 80, color: bool = False) -> list[str]:
    paint = _Painter(color)
    gpus = [shown_fields(gpu) for gpu in gpus]
    name_w, cells = _gpu_columns(width)
    bar_w = cells + 2
    lines = [
        paint(
            f"{'GPU':>3} {'NAME':<{name_w}} {'MEMORY':<{bar_w}}"
            f" {'USED/TOTAL':>13} {'AVAILABLE':>9} {'UTIL':>4}",
            bold=True,
        )
    ]
    for gpu in gpus:
        # "NVIDIA A100-SXM4-80GB": every card here is NVIDIA's; the model is what tells them apart.
        name = _clip(gpu.name.removeprefix("NVIDIA "), name_w, "+")
        if gpu.state == "ok":
            bar = memory_bar(gpu, cells, paint)
            used = f"{format_size(gpu.used)}/{format_size(gpu.total)}"
            util = "-" if gpu.util is None else f"{gpu.util}%"
            tail = f" {used:>13} {format_size(gpu.available):>9} {util:>4}"
        else:
            why = f"{gpu.state}: {gpu.error}" if gpu.error else str(gpu.state)
            bar = paint(f"{_clip(why, bar_w):<{bar_w}}", "red" if gpu.state == "lost" else None)
            tail = f" {'-/' + format_size(gpu.total):>13} {'-':>9} {'-':>4}"
        lines.append(f"{gpu.index:>3} {name:<{name_w}} {bar}{tail}")
        if gpu.state == "ok" and gpu.short > 0:  # its bar cannot show what is missing
            lines.append(
                paint(
                    f"{'':>3} GPU {gpu.index} is {format_size(gpu.short, tabular=False)} short of"
                    " its jobs' reservations: a job there may run out of memory",
                    "red",
                )
            )
        if gpu.others:  # memory outside gpusched, said whose (as gpustat does)
            indent = " " * (3 + 1 + name_w + 1)
            listed = ", ".join(outside_process(p) for p in gpu.others)
            lines.append(indent + _clip(f"others: {listed}", width - len(indent)))
    if gpus:
        lines.append(_legend(width, 3 + 1 + name_w + 1, paint))
    return lines


def outside_process(process: dict[str, object]) -> str:
    """`bob:python3/4242(10G)`: owner, program, pid and memory, as gpustat shows them."""
    user = shown(str(process.get("user") or "?"))
    command = shown(str(process.get("command") or "?"))
    used = process.get("used")
    size = format_size(used, tabular=False) if isinstance(used, int) else "?"
    return f"{user}:{command}/{process.get('pid')}({size})"


def _legend(width: int, indent: int, paint: _Painter) -> str:
    """What the bar's characters mean, under the bars (shorter on a narrow terminal)."""
    words = ("gpusched jobs", "other processes", "reserved", "free")
    if indent + 54 > width:
        words = ("jobs", "others", "reserved", "free")
        indent = min(indent, max(0, width - 34))
    chars = (BAR_JOBS, BAR_OTHERS, BAR_RESERVED, BAR_FREE)
    items = [
        paint(c, _SEGMENT_COLORS[c], **({"dim": True} if c == BAR_FREE else {})) + " " + w
        for c, w in zip(chars, words, strict=True)
    ]
    return " " * indent + "  ".join(items)


def _job_what(job: JobLike) -> list[str]:
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
    is cut."""
    words = list(words)
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
    return _clip(text, width)


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
    job: JobLike, now: datetime, width: int, paint: _Painter, mem_width: int = 7
) -> list[str]:
    # TIME: running for, waiting for, or (ended) ran for.
    state = str(job.state)
    if state == RUNNING:
        since = _seconds_since(job.started_at, now)
    elif state in ENDED_STATES:
        ended = _seconds_since(job.ended_at, now)
        started = _seconds_since(job.started_at, now)
        since = None if ended is None or started is None else started - ended
    else:
        since = _seconds_since(job.submitted_at, now)
    elapsed = "-" if since is None else format_duration(since)
    head = (
        f"{job.id:>6}  {_clip(job.user, 10, '+'):<10}  {format_indices(job.gpu_indices):<5}"
        f" {_job_mem(job):>{mem_width}}  {elapsed:>6}  "
    )
    room = max(10, width - len(head))
    words = _job_what(job)
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
                _clip(" ".join(wrapped[NOTE_LINES - 1 :]), width - len(indent)),
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
    paint = _Painter(color)
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
        lines += [_Painter(color)(line, "yellow", bold=True) for line in textwrap.wrap(text, width)]
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
