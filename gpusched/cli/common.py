"""What every command module shares: the client for this invocation, job and array ids
from the command line, JSON output, and the placement options of `submit` and `run`
(the choice of colour is cli/status_view.py's, which the fast path imports without click).

Its own module (not cli/group.py) because that module imports the command modules to
register them; helpers there would make each command module import it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpusched.client import Client
from gpusched.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from gpusched.core.models import Job, JobState
from gpusched.core.sanitize import shown
from gpusched.core.units import parse_duration

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


def client_of(ctx: click.Context) -> Client:
    """A client for the socket and config given to the group (--socket, --config)."""
    obj = ctx.find_root().obj or {}
    socket = None if obj.get("socket_from_env") else obj.get("socket")
    return Client(socket, obj.get("config"))


def follower_of(ctx: click.Context) -> Client:
    """client_of()'s client for a command that follows a job until it ends (`wait`,
    `logs -f`): its requests ride out a daemon restart for FOLLOW_WAIT_S."""
    from gpusched.connection import FOLLOW_WAIT_S

    client = client_of(ctx)
    client.follow_s = FOLLOW_WAIT_S
    return client


def since_time(text: str) -> str:
    """`--since`: a time ago ("12h", "2d") or an ISO date and time (local time unless it
    names a zone), as the UTC ISO timestamp the daemon compares with."""
    from gpusched.core.clock import iso  # only `history --since` needs it: not at every start

    try:
        try:
            moment = datetime.now(timezone.utc) - timedelta(seconds=parse_duration(text))
        except UsageError:
            try:
                moment = datetime.fromisoformat(text.strip())
            except ValueError:
                raise UsageError(
                    f"--since {text!r}: expected a time ago (12h, 2d) or a date and time"
                    " (2026-11-21, 2026-11-21T08:00)"
                ) from None
            if moment.tzinfo is None:
                moment = moment.astimezone()  # the user's local time
        return iso(moment.astimezone(timezone.utc))
    except (OverflowError, ValueError):  # before the year 1 or after 9999, once in UTC
        raise UsageError(f"--since {text!r}: out of the range of dates (years 1 to 9999)") from None


# Completion runs while the user waits at the prompt: a daemon that is slow to answer
# must cost a moment, not the shell.
COMPLETION_TIMEOUT_S = 1.0


def job_ids_completer(
    ended_too: bool = False, arrays: bool = False
) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    """Shell completion for job ids: the caller's own active jobs (`ended_too`: and the
    recently ended ones), each with its state and name, in id order; `arrays`: their
    arrays' ids (aN) too, after them.

    Asks the daemon (one `status` request); offers nothing when it cannot be reached.
    """

    def complete(
        ctx: click.Context, _param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        params = ctx.find_root().params
        try:
            client = Client(
                params.get("socket_path"), params.get("config"), timeout_s=COMPLETION_TIMEOUT_S
            )
            jobs = client.status(all=ended_too).jobs
        except Exception:  # completion must never print a traceback into the user's prompt
            return []
        uid = os.getuid()
        mine = sorted((job for job in jobs if uid in (0, job.uid)), key=lambda job: job.id)
        items = [
            CompletionItem(
                str(job.id), help=shown(f"{job.state} {job.name or ' '.join(job.command)}")
            )
            for job in mine
            if str(job.id).startswith(incomplete)
        ]
        if arrays:
            sizes: dict[int, int] = {}
            for job in mine:
                if job.array_id is not None:
                    sizes[job.array_id] = sizes.get(job.array_id, 0) + 1
            items += [
                CompletionItem(f"a{array_id}", help=f"array of {count} job(s) listed")
                for array_id, count in sorted(sizes.items())
                if f"a{array_id}".startswith(incomplete)
            ]
        return items

    return complete


class _JobId(click.ParamType):
    """One job id: ASCII digits (as the fast path reads them), said so when it is not;
    the daemon answers a number that names no job."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()):
            self.fail(f"{value!r} is not a job id (a number such as 12)", param, ctx)
        return int(text)


# The id arguments of the job commands, with their shell completion.
JOB_OR_ARRAY_IDS = click.argument(
    "ids", nargs=-1, required=True, shell_complete=job_ids_completer(arrays=True)
)
ACTIVE_JOB_ID = click.argument("job_id", type=_JobId(), shell_complete=job_ids_completer())
ANY_JOB_ID = click.argument(
    "job_id", type=_JobId(), shell_complete=job_ids_completer(ended_too=True)
)


F = TypeVar("F", bound=Callable[..., Any])


def placement_options(command: F) -> F:
    """`--exclusive` and `--share`, where a job may share a card: the same options, with
    the same words, for `submit` and `run`."""
    command = click.option(
        "--share",
        is_flag=True,
        help="The job is light (waits on data or a user): it may share a busy card.",
    )(command)
    return click.option(
        "--exclusive",
        is_flag=True,
        help="A GPU to itself: no other gpusched job joins its card (for jobs that use all"
        " of a card's compute).",
    )(command)


def host_options(interactive: bool = False) -> Callable[[F], F]:
    """`--ram` and `--cpus`, the job's share of the server itself: the same options, with
    the same words, for `submit` and `run` (`interactive`: whose command is not confined
    when it gives neither)."""
    cores = "no cpuset" if interactive else "its GPUs' share of the server's cores"
    memory = "no limit of its own" if interactive else "its GPUs' share of the server's memory"

    def add(command: F) -> F:
        command = click.option(
            "--cpus",
            type=int,
            metavar="N",
            help="Cores, a cpuset of its own (apart from other jobs' while there are cores"
            f" enough), reserved for it; it waits while fewer are free. Default: {cores}.",
        )(command)
        return click.option(
            "--ram",
            metavar="SIZE",
            help="Host memory (not GPU memory), e.g. 24G: its limit (its /dev/shm and page"
            f" cache count), reserved for it; it waits while less is free. Default: {memory}.",
        )(command)

    return add


def exit_status(job: Job) -> int:
    """What `wait` and `logs -f` exit with for one ended job: its exit code when it exited,
    else 0 if it is done and 1 (it was cancelled, killed, lost or never started)."""
    if job.exit_code is not None and job.state in (JobState.DONE, JobState.FAILED):
        return job.exit_code
    return EXIT_OK if job.state == JobState.DONE else EXIT_FAILED


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


def parse_ids(values: Sequence[str]) -> list[int]:
    return parse_targets(values, arrays_allowed=False)[0]


def parse_targets(
    values: Sequence[str], arrays_allowed: bool = True
) -> tuple[list[int], list[int]]:
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


def expand_arrays(client: Client, values: Sequence[str]) -> list[int]:
    """Job ids, with each array id replaced by its jobs' ids (one request per array)."""
    jobs, arrays = parse_targets(values)
    for array_id in arrays:
        jobs.extend(job.id for job in client.array(array_id))
    return jobs
