"""Commands that only look: status (with --watch), show, logs and history.

They read through the client and format for people (or print the JSON as the daemon
sent it); the status screen itself is drawn by render.py, imported only when drawn.
What they print for people passes through `sanitize` (users' strings shown escaped);
the JSON is exact (JSON escapes every control character).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from gpusched.cli.common import (
    ANY_JOB_ID,
    client_of,
    exit_status,
    job_ids_completer,
    parse_targets,
    print_json,
    since_time,
    use_color,
)
from gpusched.cli.help import ExampleLastCommand
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.core.models import Drain, GpuReport, Job, NodeStatus
from gpusched.core.sanitize import shown, shown_fields
from gpusched.core.units import format_duration, format_size

LABEL_WIDTH = 11  # `show`'s values start here ("exit code: 0")
WAITING_SHOWN = 200  # `status` lists this many waiting jobs and counts the rest
ENDED_SHOWN = 20  # `status --all`: this many recently ended jobs (the daemon's default)
ENDED_SHOWN_MAX = 1000  # the most the daemon lists (`--limit 0`)


def _job_where(job: Job) -> str:
    if job.gpu_indices:
        return ",".join(map(str, job.gpu_indices))
    return "-"


def _job_what(job: Job) -> str:
    return job.name or " ".join(job.command)


@click.command(cls=ExampleLastCommand)
@click.option("--json", "as_json", is_flag=True, help="Print {gpus: [...], jobs: [...]} as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also show recently ended jobs.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help=f"Show the first N waiting jobs and count the rest, and with --all the N most"
    f" recently ended (default: {WAITING_SHOWN} waiting, {ENDED_SHOWN} ended; 0: all"
    f" waiting and the last {ENDED_SHOWN_MAX} ended). --json lists every waiting job.",
)
@click.option("--mine", is_flag=True, help="Only your own jobs.")
@click.option("--user", metavar="NAME", help="Only this user's jobs.")
@click.option("-w", "--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="With --watch: time between redraws.",
)
@click.argument(
    "targets", nargs=-1, metavar="[ID|aN]...", shell_complete=job_ids_completer(arrays=True)
)
@click.pass_context
def status(
    ctx: click.Context,
    as_json: bool,
    show_all: bool,
    limit: int | None,
    watch: bool,
    interval: float,
    targets: tuple[str, ...],
    mine: bool = False,
    user: str | None = None,
) -> None:
    """Show GPUs (a memory bar: gpusched jobs, other processes, reserved, free; and
    utilization) and jobs: running, waiting (with why), recently ended (--all).

    Given job ids or array ids (aN), show only those jobs, ended ones included.
    Colours only on a terminal, and never with NO_COLOR set.

    \b
    Example:
      gpusched status --all
      gpusched status --mine --all --limit 5
      gpusched status a3
      gpusched status --watch --interval 5
    """
    if mine and user is not None:
        raise UsageError("--mine and --user NAME: give one of them")
    if targets and (mine or user is not None):
        raise UsageError("job ids already say which jobs: --mine and --user go without them")
    if mine:
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            raise UsageError(f"--mine: uid {os.getuid()} has no user name here") from None
    client = client_of(ctx)
    waiting_shown = WAITING_SHOWN if limit is None else limit
    ended = ENDED_SHOWN if limit is None else limit or ENDED_SHOWN_MAX

    def fetch() -> dict[str, Any]:
        if targets:
            result = client.status_reply(states=["running"], first=1)
            job_ids, arrays = parse_targets(targets)
            from gpusched.core.requests.views import ShowRequest

            chosen = [client.send(ShowRequest(job_id)) for job_id in job_ids]
            if arrays:
                from gpusched.core.requests.catalog import ArrayRequest

                for array_id in arrays:
                    chosen.extend(client.send(ArrayRequest(array_id)))
            result["jobs"] = chosen
        elif as_json or waiting_shown == 0:
            result = client.status_reply(all=show_all, user=user, ended=ended)
        else:  # every running job, the first `limit` waiting ones, and how many more wait
            result = client.status_reply(all=show_all, states=["running"], user=user, ended=ended)
            waiting = client.status_reply(states=["queued", "held"], first=waiting_shown, user=user)
            from gpusched.core.requests.replies import merge_status_pages

            view = merge_status_pages(result, waiting)
            result["jobs"] = view["waiting"] + view["running"]
            result["more_waiting"] = view["more_waiting"]
        return result

    if watch:
        if as_json:
            raise UsageError("--watch redraws a screen for people; use --json without it")
        _watch(lambda: _status_text(fetch(), show_all, use_color()), interval)
        return
    result = fetch()
    if as_json:  # the interface contract's shape (DESIGN.md): no paging fields
        shape = ("gpus", "jobs", "drain", "nodes")
        print_json({key: result[key] for key in shape if key in result})
        return
    click.echo(_status_text(result, show_all, use_color()))


def _status_text(result: dict[str, Any], show_all: bool, color: bool) -> str:
    import shutil

    from gpusched.cli.render import render_status

    return render_status(
        [GpuReport.from_json(g) for g in result["gpus"]],
        [Job.from_json(j) for j in result["jobs"]],
        width=shutil.get_terminal_size((80, 24)).columns,
        color=color,
        show_all=show_all,
        drain=None if result.get("drain") is None else Drain.from_json(result["drain"]),
        more_waiting=result.get("more_waiting", 0),
        nodes=[NodeStatus.from_json(n) for n in result.get("nodes", [])],
    )


def _watch(frame: Callable[[], str], interval: float) -> None:
    """Redraw frame() every `interval` seconds until Ctrl-C (which exits 0, quietly).

    A daemon that stops answering (restarting, say) is shown, not fatal: the next
    redraw tries again.
    """
    tty = sys.stdout.isatty()
    try:
        while True:
            try:
                text = frame()
            except GpuschedError as exc:
                text = f"gpusched: {shown(exc.message)}"
            stamp = time.strftime("%H:%M:%S")
            every = format_duration(interval, exact=True)
            header = f"every {every}: gpusched status    {stamp}    (Ctrl-C to stop)"
            if tty:
                click.clear()
            click.echo(header + "\n\n" + text)
            if not tty:
                click.echo("")
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        click.echo("")


@click.command(cls=ExampleLastCommand)
@ANY_JOB_ID
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show everything about one job.

    \b
    Example:
      gpusched show 12
    """
    from gpusched.cli.estimate import usage_rows  # `show` alone needs it: not for `status`

    job, timeline = client_of(ctx).job_and_timeline(job_id)
    if as_json:
        print_json({**job.to_json(), "timeline": [p.to_json() for p in timeline]})
        return
    job = shown_fields(job)
    rows = [
        ("id", job.id),
        ("name", job.name or "-"),
        ("user", f"{job.user} (uid {job.uid})"),
        ("state", job.state),
        ("command", " ".join(job.command)),
        ("cwd", job.cwd),
        ("mem", f"{format_size(job.mem)} per GPU" if job.mem else "a whole GPU"),
        ("gpus", f"{job.gpus} (indices {_job_where(job)})"),
        ("priority", job.priority),
        ("after", ",".join(map(str, job.after)) or "-"),
        ("submitted", job.submitted_at),
        ("started", job.started_at or "-"),
        ("ended", job.ended_at or "-"),
        ("pid", job.pid or "-"),
        ("exit code", "-" if job.exit_code is None else job.exit_code),
        (
            "reason",
            f"{job.reason}: {job.reason_detail}" if job.reason_detail else job.reason or "-",
        ),
        *usage_rows(job),
        (
            "log",
            job.log_path or ("- (interactive: output to its terminal)" if job.interactive else "-"),
        ),
    ]
    if job.warning:
        rows.append(("warning", job.warning))
    if job.notify:
        rows.append(("notify", shlex.join(job.notify)))  # as it was given: quotes kept
        if job.notify_result is not None:
            rows.append(("notify ran", notify_outcome(job.notify_result)))
    for attempt in job.attempts or []:
        rows.append((f"run {attempt['attempt']}", attempt_text(attempt)))
    if job.waiting_reason:
        rows.insert(4, ("waiting", job.waiting_reason))
    for line in labelled(rows):
        click.echo(line)
    import shutil

    from gpusched.cli.sparkline import glyphs_for, render_timeline

    for line in render_timeline(
        timeline,
        declared_bytes=job.mem,
        gpus=job.gpus,
        width=shutil.get_terminal_size((80, 24)).columns,
        glyphs=glyphs_for(sys.stdout.encoding),
    ):
        click.echo(line)
    for hint in job.hints:
        click.echo(f"{'hint:':<{LABEL_WIDTH}}{hint}")


@click.command(cls=ExampleLastCommand)
@ANY_JOB_ID
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option(
    "--raw",
    is_flag=True,
    help="The output's exact bytes, also on a terminal for another user's job.",
)
@click.pass_context
def logs(ctx: click.Context, job_id: int, follow: bool, raw: bool = False) -> None:
    """Print a job's output (stdout and stderr, interleaved). With -f, follow it until
    the job ends and exit with the job's exit code, as `wait` does.

    Your own jobs' output is printed as it is. Another user's (root and administrators
    may read it) is, on a terminal, shown with its control characters escaped: they
    are that user's bytes, and a terminal would obey them (--raw: as they are).

    \b
    Example:
      gpusched logs -f 12
    """
    client = client_of(ctx)
    out = sys.stdout.buffer
    escape = not raw and sys.stdout.isatty() and client.job(job_id).uid != os.getuid()
    write = _escaped_writer(out) if escape else lambda data, _final=False: out.write(data)
    offset = 0
    while True:
        chunk = client.logs(job_id, offset)
        if chunk.data:
            write(chunk.data)
            out.flush()
            offset = chunk.offset
            continue
        if not follow or chunk.ended:
            write(b"", True)  # the end of a character cut short, escaped
            out.flush()
            if follow:  # `logs -f 12 && next-step`: the job's outcome, as `wait` gives it
                ctx.exit(exit_status(client.job(job_id)))
            return
        time.sleep(0.2)


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


def _escaped_writer(out: Any) -> Callable[..., Any]:
    """write(data, final=False) showing another user's output on this terminal with every
    control character but newline and tab escaped (a UTF-8 character may span chunks)."""
    import codecs

    from gpusched.core.sanitize import shown_output

    decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    encoding = sys.stdout.encoding or "utf-8"

    def write(data: bytes, final: bool = False) -> None:
        text = shown_output(decoder.decode(data, final))
        out.write(text.encode(encoding, "backslashreplace"))

    return write


def attempt_text(attempt: dict[str, Any]) -> str:
    """An earlier run of a requeued job, on one line (sanitized: a node's name is an
    administrator's, the outcome the daemon's words)."""
    started = (attempt.get("started_at") or "-")[:19].replace("T", " ")
    ended = (attempt.get("ended_at") or "-")[:19].replace("T", " ")
    return shown(
        f"node {attempt.get('node') or '-'}, {started} to {ended}: {attempt.get('outcome')}"
    )


@click.command(cls=ExampleLastCommand)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON list.")
@click.option("--user", help="Only this user's jobs.")
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE[,STATE]",
    help="Only jobs that ended so: done, failed, cancelled, lost.",
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Only jobs that ended since WHEN: a time ago (12h, 2d) or a date and time"
    " (2026-11-21, 2026-11-21T08:00; local time unless it names a zone).",
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many."
)
@click.pass_context
def history(
    ctx: click.Context,
    as_json: bool,
    user: str | None,
    states: tuple[str, ...],
    since: str | None,
    limit: int,
) -> None:
    """List ended jobs, most recent first.

    \b
    Example:
      gpusched history --user alice --limit 5
      gpusched history --state failed,lost --since 12h
    """
    from gpusched.cli.estimate import util_text

    wanted = [name.strip() for value in states for name in value.split(",")] or None
    jobs = client_of(ctx).history(
        user=user, limit=limit, states=wanted, since=None if since is None else since_time(since)
    )
    if as_json:
        print_json([j.to_json() for j in jobs])
        return
    if not jobs:
        click.echo("no ended jobs")
        return
    jobs = [shown_fields(job) for job in jobs]
    click.echo(
        f"{'ID':<6}{'USER':<11}{'STATE':<10}{'GPU':<6}{'MEM':>7}{'PEAK':>8}{'UTIL':>6}"
        f"  {'ENDED':<20} COMMAND"
    )
    for job in jobs:
        mem = format_size(job.mem) if job.mem is not None else "whole"
        ended = (job.ended_at or "-")[:19].replace("T", " ")
        click.echo(
            f"{job.id:<6}{job.user[:10]:<11}{job.state!s:<10}{_job_where(job):<6}{mem:>7}"
            f"{format_size(job.peak_mem):>8}{util_text(job.mean_util):>6}  {ended:<20}"
            f" {_job_what(job)}"
        )
        for attempt in job.attempts or []:  # a requeued job's earlier runs
            click.echo(f"{'':<6}run {attempt['attempt']}: {attempt_text(attempt)}")
