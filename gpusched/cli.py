"""The `gpusched` command line: argument checks, formatting and exit codes.

A thin client: every command except `daemon` is one or a few requests through
`gpusched.client.Client`. Errors become one line on stderr and the contract's exit
code (0 ok, 1 failed, 2 bad usage, 3 daemon unreachable, 124 wait timed out).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from gpusched.client import Client
from gpusched.errors import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, GpuschedError, UsageError
from gpusched.models import TERMINAL_STATES, GpuReport, Job, JobState
from gpusched.units import format_size, parse_size


class _Group(click.Group):
    """Turns every GpuschedError into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpuschedError as exc:
            click.echo(f"gpusched: {exc.message}", err=True)
            ctx.exit(exc.exit_code)


def _client(ctx: click.Context) -> Client:
    obj = ctx.find_root().obj or {}
    return Client(obj.get("socket"), obj.get("config"))


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


def _ids(values: Sequence[str]) -> list[int]:
    ids = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit() or int(part) < 1:
                raise UsageError(f"invalid job id {part!r}: expected a positive number")
            ids.append(int(part))
    return ids


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config",
    envvar="GPUSCHED_CONFIG",
    type=click.Path(dir_okay=False),
    help="Config file (YAML). Env: GPUSCHED_CONFIG.",
)
@click.option(
    "--socket",
    "socket_path",
    envvar="GPUSCHED_SOCKET",
    type=click.Path(),
    help="The daemon's Unix socket. Env: GPUSCHED_SOCKET.",
)
@click.version_option(package_name="gpusched")
@click.pass_context
def cli(ctx: click.Context, config: str | None, socket_path: str | None) -> None:
    """gpusched: queue GPU jobs by declared memory on a shared server.

    Each job declares the GPU memory it needs (--mem); the daemon starts it on the
    GPU with the most available memory, as the user who submitted it, with
    CUDA_VISIBLE_DEVICES set. Jobs share a card when they fit and never overcommit it.

    \b
    Example:
      gpusched daemon --simulate 2x24G &
      gpusched submit --mem 8G -- python train.py --lr 0.1
      gpusched status
    """
    ctx.obj = {"config": config, "socket": socket_path}


@cli.command()
@click.option(
    "--simulate", metavar="SPEC", help="Simulated GPUs instead of NVML, e.g. 2x24G or 24G,16G."
)
@click.pass_context
def daemon(ctx: click.Context, simulate: str | None) -> None:
    """Run the scheduler daemon in the foreground (systemd runs this).

    Without root it serves only its own user, with the socket in $XDG_RUNTIME_DIR
    and the database and logs under ~/.local/state/gpusched.

    \b
    Example:
      gpusched daemon --simulate 2x24G
    """
    from pathlib import Path

    from gpusched.daemon import run_daemon

    config = ctx.find_root().obj.get("config")
    ctx.exit(run_daemon(Path(config) if config else None, simulate))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--mem", metavar="SIZE", help="GPU memory per GPU, e.g. 8G or 512M. Omit for a whole GPU."
)
@click.option("--gpus", type=int, default=1, show_default=True, help="Number of GPUs.")
@click.option("--name", help="A name to show in status.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher starts first.")
@click.option("--after", metavar="ID,...", help="Start only after these jobs succeeded.")
@click.option("--hold", is_flag=True, help="Queue the job held; start it with `gpusched release`.")
@click.option(
    "--cwd", type=click.Path(file_okay=False), help="Working directory (default: the current one)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON instead of its id.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def submit(
    ctx: click.Context,
    mem: str | None,
    gpus: int,
    name: str | None,
    priority: int,
    after: str | None,
    hold: bool,
    cwd: str | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Queue COMMAND; print the new job's id.

    The job runs with your environment, working directory and arguments (never
    through a shell) when a GPU has --mem available. A first word ending in .py
    that is not executable runs with the python on your PATH. Put -- before the
    command when its own options could be mistaken for gpusched's.

    \b
    Example:
      id=$(gpusched submit --mem 10G -- python train.py --epochs 5)
      gpusched submit train.py --mem 8G
    """
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    size = parse_size(mem) if mem is not None else None
    job = _client(ctx).submit(
        list(command),
        mem=size,
        gpus=gpus,
        name=name,
        priority=priority,
        after=_ids([after]) if after else (),
        hold=hold,
        cwd=cwd,
    )
    if as_json:
        _print_json(job.to_json())
    else:
        click.echo(job.id)


def _gpu_line(gpu: GpuReport) -> str:
    util = "-" if gpu.util is None else f"{gpu.util}%"
    jobs = ",".join(map(str, gpu.jobs)) or "-"
    return (
        f"{gpu.index:<4}{gpu.name[:20]:<21}{format_size(gpu.total):>8}{format_size(gpu.used):>8}"
        f"{format_size(gpu.reserved):>10}{format_size(gpu.available):>11}{util:>6}"
        f"  {gpu.state:<6}{jobs}"
    )


def _job_where(job: Job) -> str:
    if job.gpu_indices:
        return ",".join(map(str, job.gpu_indices))
    return "-"


def _job_what(job: Job) -> str:
    return job.name or " ".join(job.command)


def _job_line(job: Job) -> str:
    mem = format_size(job.mem) if job.mem is not None else "whole"
    line = (
        f"{job.id:<6}{job.user[:10]:<11}{job.state!s:<10}{_job_where(job):<6}"
        f"{mem:>7}{'' if job.gpus == 1 else ' x' + str(job.gpus):<4} {_job_what(job)}"
    )
    if job.waiting_reason:
        line += f"\n{'':<6}  waiting: {job.waiting_reason}"
    elif job.state in TERMINAL_STATES:
        code = "" if job.exit_code is None else f"exit {job.exit_code}"
        line += (
            f"  [{code}]"
            if job.reason == "exit"
            else f"  [{job.reason}{' ' + code if code else ''}]"
        )
    return line


JOB_HEADER = f"{'ID':<6}{'USER':<11}{'STATE':<10}{'GPU':<6}{'MEM':>7}     COMMAND"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print {gpus: [...], jobs: [...]} as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also show recently ended jobs.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """Show GPUs (memory total, used, reserved, available) and active jobs.

    \b
    Example:
      gpusched status --all
    """
    result = _client(ctx).request("status", all=show_all)
    if as_json:
        _print_json(result)
        return
    click.echo(
        f"{'GPU':<4}{'NAME':<21}{'TOTAL':>8}{'USED':>8}{'RESERVED':>10}{'AVAILABLE':>11}"
        f"{'UTIL':>6}  {'STATE':<6}JOBS"
    )
    for data in result["gpus"]:
        click.echo(_gpu_line(GpuReport.from_json(data)))
    jobs = [Job.from_json(j) for j in result["jobs"]]
    click.echo("")
    if not jobs:
        click.echo("no jobs" + ("" if show_all else " (--all shows recently ended ones)"))
        return
    click.echo(JOB_HEADER)
    for job in jobs:
        click.echo(_job_line(job))


@cli.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show everything about one job.

    \b
    Example:
      gpusched show 12
    """
    job = _client(ctx).job(job_id)
    if as_json:
        _print_json(job.to_json())
        return
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
        ("peak mem", format_size(job.peak_mem)),
        ("log", job.log_path or "-"),
    ]
    if job.waiting_reason:
        rows.insert(4, ("waiting", job.waiting_reason))
    for key, value in rows:
        click.echo(f"{key + ':':<11}{value}")
    for hint in job.hints:
        click.echo(f"hint:      {hint}")


@cli.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.pass_context
def logs(ctx: click.Context, job_id: int, follow: bool) -> None:
    """Print a job's output (stdout and stderr, interleaved).

    \b
    Example:
      gpusched logs -f 12
    """
    client = _client(ctx)
    out = sys.stdout.buffer
    offset = 0
    while True:
        chunk = client.logs(job_id, offset)
        if chunk.data:
            out.write(chunk.data)
            out.flush()
            offset = chunk.offset
            continue
        if not follow or chunk.ended:
            return
        time.sleep(0.2)


def _for_each(ctx: click.Context, ids: Sequence[str], op: str, verb: str) -> None:
    client = _client(ctx)
    failed = False
    for job_id in _ids(ids):
        try:
            job = Job.from_json(client.request(op, id=job_id))
            click.echo(f"job {job.id}: {verb} ({job.state})")
        except GpuschedError as exc:
            if exc.exit_code != EXIT_FAILED:
                raise
            click.echo(f"gpusched: {exc.message}", err=True)
            failed = True
    ctx.exit(EXIT_FAILED if failed else EXIT_OK)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """Cancel jobs: queued ones never start; running ones get SIGTERM on their whole
    process tree, then SIGKILL after the grace period.

    \b
    Example:
      gpusched cancel 12 13
    """
    _for_each(ctx, ids, "cancel", "cancel requested")


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@click.pass_context
def hold(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """Keep queued jobs from starting until released.

    \b
    Example:
      gpusched hold 12
    """
    _for_each(ctx, ids, "hold", "held")


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@click.pass_context
def release(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """Let held jobs start again.

    \b
    Example:
      gpusched release 12
    """
    _for_each(ctx, ids, "release", "released")


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@click.option(
    "--timeout", type=float, metavar="SECONDS", help="Give up after this long (exit 124)."
)
@click.pass_context
def wait(ctx: click.Context, ids: tuple[str, ...], timeout: float | None) -> None:
    """Wait until jobs end. With one id, exit with that job's exit code.

    With several ids, exit 0 if all succeeded, else 1.

    \b
    Example:
      gpusched wait 12 && echo trained
    """
    if timeout is not None and timeout < 0:
        raise UsageError("--timeout must not be negative")
    job_ids = _ids(ids)
    jobs = _client(ctx).wait(job_ids, timeout=timeout)
    if any(job.state not in TERMINAL_STATES for job in jobs):
        click.echo(
            "gpusched: timed out waiting for job(s) "
            + ", ".join(str(j.id) for j in jobs if j.state not in TERMINAL_STATES),
            err=True,
        )
        ctx.exit(EXIT_TIMEOUT)
    if len(jobs) == 1:
        job = jobs[0]
        if job.exit_code is not None and job.state in (JobState.DONE, JobState.FAILED):
            ctx.exit(job.exit_code)
        ctx.exit(EXIT_OK if job.state == JobState.DONE else EXIT_FAILED)
    ctx.exit(EXIT_OK if all(j.state == JobState.DONE for j in jobs) else EXIT_FAILED)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON list.")
@click.option("--user", help="Only this user's jobs.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many."
)
@click.pass_context
def history(ctx: click.Context, as_json: bool, user: str | None, limit: int) -> None:
    """List ended jobs, most recent first.

    \b
    Example:
      gpusched history --user alice --limit 5
    """
    jobs = _client(ctx).history(user=user, limit=limit)
    if as_json:
        _print_json([j.to_json() for j in jobs])
        return
    if not jobs:
        click.echo("no ended jobs")
        return
    click.echo(
        f"{'ID':<6}{'USER':<11}{'STATE':<10}{'GPU':<6}{'MEM':>7}{'PEAK':>8}  {'ENDED':<20} COMMAND"
    )
    for job in jobs:
        mem = format_size(job.mem) if job.mem is not None else "whole"
        ended = (job.ended_at or "-")[:19].replace("T", " ")
        click.echo(
            f"{job.id:<6}{job.user[:10]:<11}{job.state!s:<10}{_job_where(job):<6}{mem:>7}"
            f"{format_size(job.peak_mem):>8}  {ended:<20} {_job_what(job)}"
        )


def main() -> None:
    cli(prog_name="gpusched")
