"""The `gpusched` command line: argument checks, formatting and exit codes.

A thin client: every command except `daemon` is one or a few requests through
`gpusched.client.Client`. Errors become one line on stderr and the contract's exit
code (0 ok, 1 failed, 2 bad usage, 3 daemon unreachable, 124 wait timed out).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from gpusched.cli_help import ExampleLastGroup
from gpusched.cli_usage import auto_mem, estimate, follow_retries, usage_rows, util_text
from gpusched.client import Client
from gpusched.errors import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, GpuschedError, UsageError
from gpusched.models import TERMINAL_STATES, GpuReport, Job, JobState
from gpusched.sweep import parse_sweep_option
from gpusched.units import format_size, parse_duration, parse_size


class _Group(ExampleLastGroup):
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
    return _targets(values, arrays_allowed=False)[0]


def _targets(values: Sequence[str], arrays_allowed: bool = True) -> tuple[list[int], list[int]]:
    """Job ids ("12", "12,13") and array ids ("a3") from the command line."""
    jobs: list[int] = []
    arrays: list[int] = []
    for value in values:
        for part in value.split(","):
            text = part.strip()
            is_array = arrays_allowed and text[:1] in ("a", "A")
            number = text[1:] if is_array else text
            if not number.isdigit() or int(number) < 1:
                expected = "a job id (12) or an array id (a3)" if arrays_allowed else "a job id"
                raise UsageError(f"invalid id {part!r}: expected {expected}")
            (arrays if is_array else jobs).append(int(number))
    return jobs, arrays


def _expand_arrays(client: Client, values: Sequence[str]) -> list[int]:
    jobs, arrays = _targets(values)
    for array_id in arrays:
        jobs.extend(job.id for job in client.array(array_id))
    return jobs


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
    "--mem",
    metavar="SIZE",
    help="GPU memory per GPU, e.g. 8G or 512M. Omit for a whole GPU. 'auto': from the peaks"
    " of your earlier runs of the same command (see `gpusched estimate --history`).",
)
@click.option("--gpus", type=int, default=1, show_default=True, help="Number of GPUs.")
@click.option("--name", help="A name to show in status.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher starts first.")
@click.option("--after", metavar="ID,...", help="Start only after these jobs succeeded.")
@click.option("--hold", is_flag=True, help="Queue the job held; start it with `gpusched release`.")
@click.option(
    "--cwd", type=click.Path(file_okay=False), help="Working directory (default: the current one)."
)
@click.option(
    "--time",
    "time_limit",
    metavar="DURATION",
    help="Stop the job (SIGTERM, then SIGKILL) if it runs longer, e.g. 2h or 30m.",
)
@click.option(
    "--sweep",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="Submit one job per value (repeat for a cartesian product); {NAME} in the"
    " command is replaced. The jobs form an array (id aN).",
)
@click.option(
    "--max-concurrent",
    type=int,
    metavar="K",
    help="With --sweep: at most K jobs of the array run at once.",
)
@click.option(
    "--notify",
    metavar="CMD",
    help="When the job ends, run CMD as you with the job's JSON on stdin. CMD is split"
    " into words like a shell would but never run by one: write sh -c '...' for a shell.",
)
@click.option(
    "--retry-oom",
    type=click.IntRange(0, 10),
    default=0,
    metavar="N",
    help="If the job runs out of GPU memory, queue it again in its place with 1.5x --mem"
    " (at most what the largest GPU gives), up to N times.",
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
    time_limit: str | None,
    sweep: tuple[str, ...],
    max_concurrent: int | None,
    as_json: bool,
    command: tuple[str, ...],
    notify: str | None = None,
    retry_oom: int = 0,
) -> None:
    """Queue COMMAND; print the new job's id (with --sweep, one id per line).

    The job runs with your environment, working directory and arguments (never
    through a shell) when a GPU has --mem available. A first word ending in .py
    that is not executable runs with the python on your PATH. Put -- before the
    command when its own options could be mistaken for gpusched's.

    \b
    Example:
      id=$(gpusched submit --mem 10G -- python train.py --epochs 5)
      gpusched submit train.py --mem 8G
      gpusched submit --mem 8G --notify 'mail -s "job done" me@lab.org' -- python train.py
      gpusched submit --mem 8G --sweep lr=0.1,0.01 --sweep bs=32,64 \\
          --max-concurrent 2 -- python train.py --lr {lr} --bs {bs}
    """
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    if max_concurrent is not None and not sweep:
        raise UsageError("--max-concurrent applies to a --sweep array")
    options: dict[str, Any] = {
        "mem": None if mem is None else "auto" if mem == "auto" else parse_size(mem),
        "gpus": gpus,
        "name": name,
        "priority": priority,
        "after": _ids([after]) if after else (),
        "hold": hold,
        "cwd": cwd,
        "time_limit": parse_duration(time_limit) if time_limit is not None else None,
        "notify": notify,
        "retry_oom": retry_oom,
    }
    client = _client(ctx)
    if options["mem"] == "auto" and not sweep:
        options["mem"] = auto_mem(client, list(command), cwd)
    if sweep:
        pairs = [parse_sweep_option(item) for item in sweep]
        jobs = client.submit_sweep(list(command), pairs, max_concurrent=max_concurrent, **options)
        if as_json:
            _print_json([j.to_json() for j in jobs])
        else:
            click.echo("\n".join(str(j.id) for j in jobs))
            click.echo(f"array a{jobs[0].array_id}: {len(jobs)} jobs", err=True)
        return
    job = client.submit(list(command), **options)
    if as_json:
        _print_json(job.to_json())
    else:
        click.echo(job.id)


def _job_where(job: Job) -> str:
    if job.gpu_indices:
        return ",".join(map(str, job.gpu_indices))
    return "-"


def _job_what(job: Job) -> str:
    return job.name or " ".join(job.command)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print {gpus: [...], jobs: [...]} as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also show recently ended jobs.")
@click.option("-w", "--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="With --watch: time between redraws.",
)
@click.argument("targets", nargs=-1, metavar="[ID|aN]...")
@click.pass_context
def status(
    ctx: click.Context,
    as_json: bool,
    show_all: bool,
    watch: bool,
    interval: float,
    targets: tuple[str, ...],
) -> None:
    """Show GPUs (a memory bar: gpusched jobs, other processes, reserved, free; and
    utilization) and jobs: running, waiting (with why), recently ended (--all).

    Given job ids or array ids (aN), show only those jobs, ended ones included.
    Colours only on a terminal, and never with NO_COLOR set.

    \b
    Example:
      gpusched status --all
      gpusched status a3
      gpusched status --watch --interval 5
    """
    client = _client(ctx)

    def fetch() -> dict[str, Any]:
        result: dict[str, Any] = client.request("status", all=show_all)
        if targets:
            job_ids, arrays = _targets(targets)
            chosen = [client.request("show", id=job_id) for job_id in job_ids]
            for array_id in arrays:
                chosen.extend(client.request("array", array=array_id))
            result["jobs"] = chosen
        return result

    if watch:
        if as_json:
            raise UsageError("--watch redraws a screen for people; use --json without it")
        _watch(lambda: _status_text(fetch(), show_all, _use_color()), interval)
        return
    result = fetch()
    if as_json:
        _print_json(result)
        return
    click.echo(_status_text(result, show_all, _use_color()))


def _use_color() -> bool:
    """Colour on a terminal only, and never with NO_COLOR set (https://no-color.org)."""
    import os

    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _status_text(result: dict[str, Any], show_all: bool, color: bool) -> str:
    import shutil

    from gpusched.render import render_status

    return render_status(
        [GpuReport.from_json(g) for g in result["gpus"]],
        [Job.from_json(j) for j in result["jobs"]],
        width=shutil.get_terminal_size((80, 24)).columns,
        color=color,
        show_all=show_all,
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
                text = f"gpusched: {exc.message}"
            stamp = time.strftime("%H:%M:%S")
            header = f"every {interval:g}s: gpusched status    {stamp}    (Ctrl-C to stop)"
            if tty:
                click.clear()
            click.echo(header + "\n\n" + text)
            if not tty:
                click.echo("")
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        click.echo("")


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
        *usage_rows(job),
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


def _for_each(
    ctx: click.Context,
    ids: Sequence[str],
    op: str,
    verb: str,
    arrays: bool = False,
    as_json: bool = False,
    done: Sequence[Job] = (),
) -> None:
    """Apply `op` to each job; with `as_json`, print the jobs (after `done`) as a list."""
    client = _client(ctx)
    failed = False
    results = list(done)
    for job_id in _expand_arrays(client, ids) if arrays else _ids(ids):
        try:
            job = Job.from_json(client.request(op, id=job_id))
            results.append(job)
            if not as_json:
                click.echo(f"job {job.id}: {verb} ({job.state})")
        except GpuschedError as exc:
            if exc.exit_code != EXIT_FAILED:
                raise
            click.echo(f"gpusched: {exc.message}", err=True)
            failed = True
    if as_json:
        _print_json([job.to_json() for job in results])
    ctx.exit(EXIT_FAILED if failed else EXIT_OK)


_JSON_JOBS = click.option(
    "--json", "as_json", is_flag=True, help="Print the jobs as a JSON list (JOB objects)."
)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@_JSON_JOBS
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[str, ...], as_json: bool) -> None:
    """Cancel jobs: queued ones never start; running ones get SIGTERM on their whole
    process tree, then SIGKILL after the grace period.

    \b
    IDs may be job ids or array ids (aN, from --sweep): an array's ended jobs are
    left as they are, its active ones cancelled.

    \b
    Example:
      gpusched cancel 12 13
      gpusched cancel a3
    """
    client = _client(ctx)
    job_ids, arrays = _targets(ids)
    done: list[Job] = []
    for array_id in arrays:
        for job in client.cancel_array(array_id):
            done.append(job)
            if not as_json:
                click.echo(f"job {job.id}: cancel requested ({job.state})")
    if job_ids:
        _for_each(
            ctx, [str(i) for i in job_ids], "cancel", "cancel requested", as_json=as_json, done=done
        )
    elif as_json:
        _print_json([job.to_json() for job in done])


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@_JSON_JOBS
@click.pass_context
def hold(ctx: click.Context, ids: tuple[str, ...], as_json: bool) -> None:
    """Keep queued jobs from starting until released.

    \b
    Example:
      gpusched hold 12
    """
    _for_each(ctx, ids, "hold", "held", as_json=as_json)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@_JSON_JOBS
@click.pass_context
def release(ctx: click.Context, ids: tuple[str, ...], as_json: bool) -> None:
    """Let held jobs start again.

    \b
    Example:
      gpusched release 12
    """
    _for_each(ctx, ids, "release", "released", as_json=as_json)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@click.option(
    "--timeout", type=float, metavar="SECONDS", help="Give up after this long (exit 124)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the jobs as a JSON list when done or timed out."
)
@click.pass_context
def wait(ctx: click.Context, ids: tuple[str, ...], timeout: float | None, as_json: bool) -> None:
    """Wait until jobs end. With one id, exit with that job's exit code.

    With several ids, exit 0 if all succeeded, else 1. A job that ran out of GPU
    memory and was retried (submit --retry-oom) is followed to its retry.

    \b
    Example:
      gpusched wait 12 && echo trained
    """
    if timeout is not None and timeout < 0:
        raise UsageError("--timeout must not be negative")
    client = _client(ctx)
    job_ids = _expand_arrays(client, ids)
    deadline = None if timeout is None else time.monotonic() + timeout
    jobs = follow_retries(client, client.wait(job_ids, timeout=timeout), deadline)
    if as_json:
        _print_json([job.to_json() for job in jobs])
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


@cli.command()
@click.argument("job_id", type=int)
@click.argument("priority", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def priority(ctx: click.Context, job_id: int, priority: int, as_json: bool = False) -> None:
    """Change the priority of a waiting job (higher starts first).

    \b
    Example:
      gpusched priority 12 10
    """
    job = _client(ctx).set_priority(job_id, priority)
    if as_json:
        _print_json(job.to_json())
        return
    click.echo(f"job {job.id}: priority {job.priority}")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the new job as JSON.")
@click.pass_context
def requeue(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Submit an ended job again: a new job with the same command, directory,
    environment and resources. Prints the new job's id.

    \b
    Example:
      gpusched requeue 12
    """
    job = _client(ctx).requeue(job_id)
    if as_json:
        _print_json(job.to_json())
    else:
        click.echo(job.id)


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, file names).

    \b
    Example:
      source <(gpusched completion bash)       # add to ~/.bashrc
      gpusched completion zsh > "${fpath[1]}/_gpusched"
      gpusched completion fish > ~/.config/fish/completions/gpusched.fish
    """
    from click.shell_completion import get_completion_class

    # click's own mechanism (_GPUSCHED_COMPLETE=bash_source gpusched), printed for the user.
    completer = get_completion_class(shell)
    if completer is None:  # click knows all three; guard against a future click
        raise UsageError(f"no completion for {shell}")
    click.echo(completer(cli, {}, "gpusched", "_GPUSCHED_COMPLETE").source())


@cli.command()
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": ..., "checks": [...]}.')
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check what usually goes wrong on a new server, with a fix for each problem:
    config valid, NVIDIA driver readable (NVML), daemon answering on its socket (and
    whose it is), state and log directories writable, systemd service active.
    Exits 1 if any check fails.

    \b
    Example:
      sudo gpusched doctor
    """
    from gpusched.doctor import FAIL, render_checks, run_checks

    obj = ctx.find_root().obj or {}
    checks = run_checks(obj.get("config"), obj.get("socket"))
    failed = any(check.status == FAIL for check in checks)
    if as_json:
        _print_json({"ok": not failed, "checks": [check.to_json() for check in checks]})
    else:
        click.echo(render_checks(checks, _use_color()))
    ctx.exit(EXIT_FAILED if failed else EXIT_OK)


cli.add_command(estimate)


def main() -> None:
    cli(prog_name="gpusched")
