"""Commands that only look: status (with --watch), show, logs and history.

They read through the client and format for people (or print the JSON as the daemon
sent it); what `status` asks and prints is cli/status_view.py's (the screen drawn by
render.py), what `show` prints cli/show_view.py's: the fast path (cli/fast.py) runs the
same code for their commonest forms without click.
What they print for people passes through `sanitize` (users' strings shown escaped);
the JSON is exact (JSON escapes every control character).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from gpusched.cli.common import (
    ANY_JOB_ID,
    client_of,
    exit_status,
    follower_of,
    job_ids_completer,
    print_json,
    since_time,
)
from gpusched.cli.help import ExampleLastCommand
from gpusched.cli.history_view import history_lines
from gpusched.cli.show_view import show_json, show_lines
from gpusched.cli.status_view import (
    ENDED_SHOWN,
    ENDED_SHOWN_MAX,
    WAITING_SHOWN,
    fetch_status,
    status_json,
    status_text,
    terminal_columns,
    use_color,
)
from gpusched.client import Client
from gpusched.core.errors import EXIT_INTERRUPTED, GpuschedError, UsageError
from gpusched.core.sanitize import shown
from gpusched.core.units import format_duration


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
    f" waiting and the last {ENDED_SHOWN_MAX} ended). --json without --limit lists every"
    " waiting job.",
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

    def fetch() -> dict[str, Any]:
        return fetch_status(
            client, targets=targets, as_json=as_json, show_all=show_all, limit=limit, user=user
        )

    if watch:
        if as_json:
            raise UsageError("--watch redraws a screen for people; use --json without it")
        _watch(lambda: status_text(fetch(), show_all, use_color()), interval)
        return
    result = fetch()
    click.echo(status_json(result) if as_json else status_text(result, show_all, use_color()))


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

    A waiting job's "expected start" is known only for the first job of the
    queue with cards kept for it, when every job running on them has a
    --time: the latest of their ends. Otherwise it is "unknown".

    \b
    Example:
      gpusched show 12
    """
    import shutil

    from gpusched.core.requests.views import ShowRequest

    reply = client_of(ctx).send(ShowRequest(job_id, timeline=True))
    if as_json:
        click.echo(show_json(reply))
        return
    for line in show_lines(reply, shutil.get_terminal_size((80, 24)).columns):
        click.echo(line)


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
    the job ends and exit with the job's exit code, as `wait` does (a daemon that
    restarts meanwhile is waited for, up to 30s away; Ctrl-C: exit 130).

    Your own jobs' output is printed as it is. Another user's (root and administrators
    may read it) is, on a terminal, shown with its control characters escaped: they
    are that user's bytes, and a terminal would obey them (--raw: as they are).

    \b
    Example:
      gpusched logs -f 12
    """
    client = follower_of(ctx) if follow else client_of(ctx)
    try:
        _print_log(ctx, client, job_id, follow, raw)
    except KeyboardInterrupt:
        ctx.exit(EXIT_INTERRUPTED)


def _print_log(ctx: click.Context, client: Client, job_id: int, follow: bool, raw: bool) -> None:
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

    STATE says how each ended: its reason where that says more than its
    state (timeout, oom, host_oom, signal, overrun, node_lost,
    dependency_failed...), else done, failed (a non-zero exit), cancelled or
    lost. --json gives `state` and `reason` apart. Long commands are
    shortened to the terminal's width, as in status.

    \b
    Example:
      gpusched history --user alice --limit 5
      gpusched history --state failed,lost --since 12h
    """
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
    for line in history_lines(jobs, terminal_columns()):
        click.echo(line)
