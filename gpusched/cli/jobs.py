"""Commands that act on jobs: cancel, hold, release, wait, priority, top, requeue, drain.

Each is one or a few requests through the client; what they print is the job's id or a
line per job (or the JSON of the jobs with --json). The views (status, show, logs,
history) are in cli/views.py, `submit` in cli/submit.py; cli/group.py registers all
of them on the group.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click

from gpusched.cli.common import (
    ACTIVE_JOB_ID,
    ANY_JOB_ID,
    JOB_OR_ARRAY_IDS,
    client_of,
    exit_status,
    expand_arrays,
    follower_of,
    job_ids_completer,
    parse_ids,
    parse_targets,
    print_json,
)
from gpusched.cli.estimate import follow_retries
from gpusched.cli.help import ExampleLastCommand
from gpusched.core.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    GpuschedError,
    UsageError,
)
from gpusched.core.models import TERMINAL_STATES, Job, JobState
from gpusched.core.sanitize import shown


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
    client = client_of(ctx)
    failed = False
    results = list(done)
    for job_id in expand_arrays(client, ids) if arrays else parse_ids(ids):
        try:
            job = Job.from_json(client.request(op, id=job_id))
            results.append(job)
            if not as_json:
                click.echo(_done_line(job, verb) if verb else _cancel_line(job))
        except GpuschedError as exc:
            if exc.exit_code != EXIT_FAILED:
                raise
            click.echo(f"gpusched: {shown(exc.message)}", err=True)
            failed = True
    if as_json:
        print_json([job.to_json() for job in results])
    ctx.exit(EXIT_FAILED if failed else EXIT_OK)


def _change_all(
    ctx: click.Context, ids: Sequence[str], action: str, verb: str, as_json: bool
) -> None:
    """`hold` or `release` every job of `ids` in one request (one pass for them all); of an
    array (aN), the jobs the action applies to: queued ones for `hold`, held for `release`."""
    client = client_of(ctx)
    job_ids, arrays = parse_targets(ids)
    applies_to = JobState.QUEUED if action == "hold" else JobState.HELD
    for array_id in arrays:
        job_ids += [j.id for j in client.array(array_id) if j.state == applies_to]
    if not job_ids:
        named = ", ".join(f"a{a}" for a in arrays)
        raise GpuschedError(f"{named}: no {applies_to} job to {action}")
    changed, refused = client.change(job_ids, action)
    for why in refused.values():
        click.echo(f"gpusched: {shown(why)}", err=True)
    if as_json:
        print_json([job.to_json() for job in changed])
    else:
        for job in changed:
            click.echo(_done_line(job, verb))
    ctx.exit(EXIT_FAILED if refused else EXIT_OK)


def _done_line(job: Job, verb: str) -> str:
    """ "job 12: held"; "job 12: released (queued)": the state only where it adds to the verb."""
    return (
        f"job {job.id}: {verb}" if verb == str(job.state) else f"job {job.id}: {verb} ({job.state})"
    )


def _cancel_line(job: Job) -> str:
    """A waiting job is cancelled at once; a running one is being stopped."""
    if job.state in TERMINAL_STATES:
        return f"job {job.id}: {job.state}"
    return f"job {job.id}: stopping (SIGTERM to its processes, SIGKILL after the grace period)"


_JSON_JOBS = click.option(
    "--json", "as_json", is_flag=True, help="Print the jobs as a JSON list (JOB objects)."
)


@click.command(cls=ExampleLastCommand)
@click.argument("reason", nargs=-1)
@click.option("--node", metavar="NAME", help="In a cluster: drain that server (default: this one).")
@click.pass_context
def drain(ctx: click.Context, reason: tuple[str, ...], node: str | None = None) -> None:
    """Start no new job until `gpusched undrain` (administrators only): running jobs go
    on, queued ones wait, users can still submit. Kept across daemon restarts.

    \b
    REASON is shown to everyone in `status` and in each waiting job's reason.

    \b
    Example:
      gpusched drain GPU 2 is replaced on Friday, back by noon
      gpusched drain --node gpu3 new fans
    """
    done = client_of(ctx).drain(" ".join(reason) or None, node=node)
    where = f"node {shown(node)}: " if node else ""
    click.echo(f"{where}{shown(done.describe())}: no new job starts; running jobs go on")


@click.command(cls=ExampleLastCommand)
@click.option("--node", metavar="NAME", help="In a cluster: that server (default: this one).")
@click.pass_context
def undrain(ctx: click.Context, node: str | None = None) -> None:
    """Let jobs start again after `gpusched drain` (administrators only).

    \b
    Example:
      gpusched undrain
      gpusched undrain --node gpu3
    """
    client_of(ctx).undrain(node=node)
    where = f"node {shown(node)}: " if node else ""
    click.echo(f"{where}not draining: queued jobs start again")


@click.command(cls=ExampleLastCommand)
@click.argument("ids", nargs=-1, shell_complete=job_ids_completer(arrays=True))
@click.option("--all", "all_mine", is_flag=True, help="Cancel every active job of yours.")
@click.option(
    "--waiting", is_flag=True, help="With --all: only your jobs that have not started yet."
)
@_JSON_JOBS
@click.pass_context
def cancel(
    ctx: click.Context, ids: tuple[str, ...], all_mine: bool, waiting: bool, as_json: bool
) -> None:
    """Cancel jobs: queued ones never start; running ones get SIGTERM on their whole
    process tree, then SIGKILL after the grace period.

    \b
    IDs may be job ids or array ids (aN, from --sweep): an array's ended jobs are
    left as they are, its active ones cancelled. --all takes your own jobs only,
    also for root: other users' jobs are cancelled by id.

    \b
    Example:
      gpusched cancel 12 13
      gpusched cancel a3
      gpusched cancel --all --waiting
    """
    if bool(ids) == all_mine:
        raise UsageError("give job ids, or --all (not both)")
    if waiting and not all_mine:
        raise UsageError("--waiting goes with --all")
    client = client_of(ctx)
    if all_mine:
        cancelled = client.cancel_mine(waiting_only=waiting)
        if as_json:
            print_json([job.to_json() for job in cancelled])
            return
        for job in cancelled:
            click.echo(_cancel_line(job))
        if not cancelled:
            click.echo(f"no {'waiting' if waiting else 'active'} jobs of yours")
        return
    job_ids, arrays = parse_targets(ids)
    done: list[Job] = []
    for array_id in arrays:
        for job in client.cancel_array(array_id):
            done.append(job)
            if not as_json:
                click.echo(_cancel_line(job))
    if job_ids:
        _for_each(ctx, [str(i) for i in job_ids], "cancel", "", as_json=as_json, done=done)
    elif as_json:
        print_json([job.to_json() for job in done])


@click.command(cls=ExampleLastCommand)
@JOB_OR_ARRAY_IDS
@_JSON_JOBS
@click.pass_context
def hold(ctx: click.Context, ids: tuple[str, ...], as_json: bool) -> None:
    """Keep queued jobs from starting until released. IDs may be job ids or array ids
    (aN, from --sweep: its queued jobs).

    \b
    Example:
      gpusched hold 12
      gpusched hold a3
    """
    _change_all(ctx, ids, "hold", "held", as_json)


@click.command(cls=ExampleLastCommand)
@JOB_OR_ARRAY_IDS
@_JSON_JOBS
@click.pass_context
def release(ctx: click.Context, ids: tuple[str, ...], as_json: bool) -> None:
    """Let held jobs start again. IDs may be job ids or array ids (aN, from --sweep: its
    held jobs).

    \b
    Example:
      gpusched release 12
      gpusched release a3
    """
    _change_all(ctx, ids, "release", "released", as_json)


@click.command(cls=ExampleLastCommand)
@JOB_OR_ARRAY_IDS
@click.option(
    "--timeout", type=float, metavar="SECONDS", help="Give up after this long (exit 124)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the jobs as a JSON list when done or timed out."
)
@click.pass_context
def wait(ctx: click.Context, ids: tuple[str, ...], timeout: float | None, as_json: bool) -> None:
    """Wait until jobs end; print one line per job saying how it ended. With one job,
    exit with its exit code (1 if it was cancelled, killed or lost).

    With several jobs (or an array, aN), exit 0 if all succeeded, else 1. A job that
    ran out of GPU memory and was retried (submit --retry-oom) is followed to its retry.
    A daemon that restarts meanwhile is waited for (up to 30s away, then exit 3);
    Ctrl-C stops waiting (exit 130), the jobs go on.

    \b
    Example:
      gpusched wait 12 && echo trained
      gpusched wait a3
    """
    if timeout is not None and timeout < 0:
        raise UsageError("--timeout must not be negative")
    client = follower_of(ctx)
    try:
        job_ids = expand_arrays(client, ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        jobs = follow_retries(client, client.wait(job_ids, timeout=timeout), deadline)
    except KeyboardInterrupt:
        ctx.exit(EXIT_INTERRUPTED)
    if as_json:
        print_json([job.to_json() for job in jobs])
    else:
        from gpusched.cli.render import ended_label

        for job in jobs:
            if job.state in TERMINAL_STATES:
                click.echo(f"job {job.id}: {shown(ended_label(job))}")
    if any(job.state not in TERMINAL_STATES for job in jobs):
        click.echo(
            "gpusched: timed out waiting for job(s) "
            + ", ".join(str(j.id) for j in jobs if j.state not in TERMINAL_STATES),
            err=True,
        )
        ctx.exit(EXIT_TIMEOUT)
    if len(jobs) == 1:
        ctx.exit(exit_status(jobs[0]))
    ctx.exit(EXIT_OK if all(j.state == JobState.DONE for j in jobs) else EXIT_FAILED)


@click.command(cls=ExampleLastCommand)
@click.argument("ids", nargs=-1, required=True, shell_complete=job_ids_completer(arrays=True))
@click.argument("priority", type=int)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the job as JSON (a JSON list of JOB objects for several ids or an array).",
)
@click.pass_context
def priority(ctx: click.Context, ids: tuple[str, ...], priority: int, as_json: bool) -> None:
    """Change the priority of waiting jobs to PRIORITY, the last argument (higher starts
    first, among your own jobs; `gpusched top`, for administrators, puts a job before
    other users' jobs).

    \b
    IDs may be job ids or array ids (aN, from --sweep): an array's ended jobs are
    left as they are. All of them change in one request; a job you may not change is
    refused on its own line (exit 1), the others still change.

    \b
    Example:
      gpusched priority 12 10
      gpusched priority 12 13 a3 5
    """
    client = client_of(ctx)
    job_ids, arrays = parse_targets(ids)
    for array_id in arrays:
        job_ids += [j.id for j in client.array(array_id) if j.state not in TERMINAL_STATES]
    changed, refused = client.change(job_ids, "priority", priority=priority)
    for why in refused.values():
        click.echo(f"gpusched: {shown(why)}", err=True)
    if as_json and len(ids) == 1 and not arrays and "," not in ids[0]:
        if changed:  # one job id: its JOB object, the reply this command always gave
            print_json(changed[0].to_json())
    elif as_json:
        print_json([job.to_json() for job in changed])
    else:
        for job in changed:
            click.echo(f"job {job.id}: priority {job.priority}")
    ctx.exit(EXIT_FAILED if refused else EXIT_OK)


@click.command(cls=ExampleLastCommand)
@ACTIVE_JOB_ID
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def top(ctx: click.Context, job_id: int, as_json: bool = False) -> None:
    """Put a waiting job ahead of every user's jobs (administrators only).

    Fair share and each user's own --priority order every other job; jobs put first
    start in the order they were put there.

    \b
    Example:
      sudo gpusched top 12
    """
    job = client_of(ctx).put_first(job_id)
    if as_json:
        print_json(job.to_json())
        return
    click.echo(f"job {job.id}: first in the queue (top {job.top})")


@click.command(cls=ExampleLastCommand)
@ANY_JOB_ID
@click.option("--json", "as_json", is_flag=True, help="Print the new job as JSON.")
@click.pass_context
def requeue(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Submit an ended job again: a new job with the same command, directory,
    environment and resources. Prints the new job's id.

    \b
    Example:
      gpusched requeue 12
    """
    job = client_of(ctx).requeue(job_id)
    if as_json:
        print_json(job.to_json())
    else:
        click.echo(job.id)
