"""`gpusched run`: wait in the queue, then run COMMAND here, in this terminal.

The command is this process's child: it runs as you, with your environment plus the
placement's (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPUSCHED_JOB_ID, ...), attached to
your terminal (gpusched.interactive.foreground). While the job waits, one line on stderr
says why; Ctrl-C then withdraws it. Exit code: the command's, or 128+N if signal N
killed it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from types import FrameType

import click

from gpusched.cli.common import client_of, host_options, placement_options
from gpusched.cli.help import ExampleLastCommand
from gpusched.client import Client
from gpusched.core.errors import EXIT_FAILED
from gpusched.core.models import Job
from gpusched.core.sanitize import shown
from gpusched.core.units import format_duration, parse_job_mem, parse_job_ram, parse_job_time
from gpusched.interactive.foreground import Attached
from gpusched.interactive.reservation import (
    NotPlaced,
    Placement,
    cancel_quietly,
    queue,
    report_end,
    wait_placed,
)
from gpusched.submitter import checked_command


class _Withdrawn(Exception):
    """SIGTERM or SIGHUP while the job waits: withdraw it, as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _withdraw(signum: int, frame: FrameType | None) -> None:
    raise _Withdrawn(signum)


class _WaitingLine:
    """Why the job waits, on one line of stderr (rewritten on a terminal, else once each)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last: str | None = None

    def show(self, job: Job) -> None:
        text = f"gpusched: job {job.id} waiting: {job.waiting_reason or 'queued'}"
        text = shown(text)
        if text == self.last:
            return
        self.last = text
        if self.tty:
            width = shutil.get_terminal_size().columns
            sys.stderr.write("\r\x1b[K" + text[: max(20, width - 1)])
            sys.stderr.flush()
        else:
            click.echo(text, err=True)

    def clear(self) -> None:
        if self.tty and self.last is not None:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@click.command(
    cls=ExampleLastCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--mem",
    metavar="SIZE",
    help="GPU memory per GPU, with a unit, at least 256M, e.g. 8G. Omit for a whole GPU.",
)
@click.option("--gpus", type=int, default=1, show_default=True, help="Number of GPUs.")
@click.option(
    "--time",
    "time_limit",
    metavar="DURATION",
    help="Stop the command (SIGTERM, then SIGKILL) if it runs longer, e.g. 2h.",
)
@click.option("--name", help="A name to show in status.")
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="Higher starts first, among your own jobs.",
)
@placement_options
@host_options(interactive=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    mem: str | None,
    gpus: int,
    time_limit: str | None,
    name: str | None,
    priority: int,
    exclusive: bool,
    share: bool,
    command: tuple[str, ...],
    ram: str | None = None,
    cpus: int | None = None,
) -> None:
    """Wait in the queue, then run COMMAND in this terminal on the GPUs it was given.

    The job shows in status and history like any other; it holds its GPUs while
    COMMAND runs and ends with it (exit code passed through: 128+N for signal N).
    Ctrl-C while waiting withdraws it; once running, Ctrl-C goes to COMMAND.
    COMMAND is checked as `submit` checks it before it queues: a program that is not
    found, or an interpreter's script that is not there, is refused (exit 2).

    \b
    Example:
      gpusched run --mem 8G -- bash              # a shell on a GPU
      gpusched run --mem 10G --time 2h -- python debug.py
    """
    client = client_of(ctx)
    # Checked as `submit` checks it: a command that cannot start is refused before it
    # queues, not found missing once it has waited for its GPUs.
    argv = checked_command(command, os.getcwd(), os.environ.get("PATH"))
    job = queue(
        client,
        argv,
        mem=None if mem is None else parse_job_mem(mem),
        gpus=gpus,
        time_limit=None if time_limit is None else parse_job_time(time_limit),
        name=name,
        priority=priority,
        exclusive=exclusive,
        share=share,
        ram=None if ram is None else parse_job_ram(ram),
        cpus=cpus,
    )
    placement = _wait(ctx, client, job)
    indices = ",".join(map(str, placement.gpu_indices))
    limit = placement.job.time_limit_s
    until = f", time limit {format_duration(limit, exact=True)}" if limit else ""
    click.echo(f"gpusched: job {job.id} running on GPU {indices}{until}", err=True)
    ctx.exit(_run_attached(client, placement, argv))


def _wait(ctx: click.Context, client: Client, job: Job) -> Placement:
    line = _WaitingLine()
    previous = {s: signal.signal(s, _withdraw) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return wait_placed(client, job.id, on_wait=line.show)
    except (KeyboardInterrupt, _Withdrawn) as stop:
        line.clear()
        cancel_quietly(client, job.id)
        click.echo(f"gpusched: job {job.id} cancelled before it started", err=True)
        signum = stop.signum if isinstance(stop, _Withdrawn) else signal.SIGINT
        ctx.exit(128 + signum)
    except NotPlaced as exc:
        line.clear()
        click.echo(f"gpusched: {shown(exc.message)}", err=True)
        ctx.exit(EXIT_FAILED)
    finally:
        line.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise AssertionError("unreachable")  # ctx.exit raised


def _run_attached(client: Client, placement: Placement, argv: list[str]) -> int:
    job_id = placement.job_id

    def stopping(signum: int) -> None:
        why = "the terminal hung up" if signum == signal.SIGHUP else _why_stopped(client, job_id)
        grace = format_duration(placement.kill_grace_s, exact=True)
        click.echo(
            f"\r\ngpusched: job {job_id}: {why}: stopping {shown(argv[0])}"
            f" (SIGTERM now, SIGKILL in {grace})",
            err=True,
        )

    try:
        attached = Attached(
            argv,
            placement.environment(dict(os.environ)),
            kill_grace_s=placement.kill_grace_s,
            on_stop=stopping,
        )
    except OSError as exc:  # not found, not executable: as a shell says it
        click.echo(f"gpusched: {shown(argv[0])}: {exc.strerror}", err=True)
        report_end(client, job_id, exit_code=127)
        return 127
    code = attached.wait()
    if code < 0:
        report_end(client, job_id, signal=-code)
        return 128 - code
    report_end(client, job_id, exit_code=code)
    return code


def _why_stopped(client: Client, job_id: int) -> str:
    """What the daemon noted when it asked us to stop (cancelled by, time limit, idle)."""
    try:
        detail = client.job(job_id).reason_detail
    except Exception:  # the daemon may be restarting: say what we know
        detail = None
    return shown(detail) if detail else "asked to stop"
