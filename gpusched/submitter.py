"""A submit from the client's side, in the submitting process: its command resolved as
it would run here (`train.py` through the python on its own PATH, so an activated venv or
conda env is honoured; a program that could never start is refused here, at submit), its
environment and umask, a `--notify` string split as a shell would split it (no shell ever
runs it), sizes and durations parsed into the request (`submit_request`), and the request
sent so that an answer lost on the way never queues the jobs twice (`send_submit`: one
request id for every try; the daemon answers a retry with what the first try made).
Client side: runs in the user's process, never the daemon's; imported only to submit.

The request is built as `SubmitRequest` (the Python API's, through the client) or as its
frame alone (`submit_frame`: the same checks, core/requests/checks.py, without the request
dataclasses, for the CLI's fast path; tests/test_cli_fast_frames.py checks the two frames
are equal). Neither typing, shutil nor the request catalog is imported at run time here."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpusched.core.commands import is_interpreter
from gpusched.core.errors import (
    MAY_HAVE_BEEN_DONE,
    DaemonUnreachable,
    GpuschedError,
    UsageError,
)
from gpusched.core.sanitize import shown
from gpusched.core.units import parse_job_mem, parse_job_ram, parse_job_time

TYPE_CHECKING = False  # typing's own import costs every `gpusched submit`
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpusched.core.requests.catalog import SubmitRequest


def which(name: str, path: str | None) -> str | None:
    """`shutil.which(name, path=path)` as it is on POSIX for text, without importing shutil
    (whose import loads zlib, bz2 and lzma: milliseconds of every `gpusched submit`);
    tests/test_cli_fast_frames.py compares the two."""
    if os.path.dirname(name):
        return name if _executable(name) else None
    if path is None:
        path = os.environ.get("PATH", None)
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):
                path = os.defpath
    if not path:
        return None
    seen = set()
    for directory in os.fsdecode(path).split(os.pathsep):
        if directory not in seen:  # os.path.normcase is the identity on POSIX
            seen.add(directory)
            candidate = os.path.join(directory, name)
            if _executable(candidate):
                return candidate
    return None


def _executable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.X_OK) and not os.path.isdir(path)


def resolve_command(command: Sequence[str], cwd: str, path_env: str | None) -> list[str]:
    """`train.py` that is not executable runs with the `python` on the submitter's PATH."""
    argv = list(command)
    if not argv:
        raise UsageError("no command given: gpusched submit [OPTIONS] -- COMMAND [ARGS...]")
    first = argv[0]
    if first.endswith(".py"):
        script = Path(cwd, first)
        if not (script.is_file() and os.access(script, os.X_OK)):
            python = which("python", path_env) or which("python3", path_env)
            if python is None:
                raise UsageError(f"cannot run {first}: no python or python3 on your PATH")
            argv.insert(0, python)
    return argv


def runnable_command(
    argv: list[str], cwd: str, path_env: str | None
) -> tuple[list[str], str | None]:
    """`argv` as the job will run it, and why it could never start (None: it can).

    The program is looked up as the job's own exec will look it up, here in the
    submitter's process with the submitter's PATH (the daemon never searches a user's PATH
    as root): a name with a slash is a path from `cwd`; any other name is searched on PATH,
    then in `cwd`, where an executable file runs as `./NAME` (the shell habit of running a
    script of the current directory by its name would otherwise end `failed_to_start`).
    """
    first = argv[0]
    if not first:
        return argv, None  # the request's own check says what an empty command lacks
    if "/" in first:
        return argv, _not_runnable(Path(cwd, first), first)
    if which(first, path_env) is not None:
        return argv, None
    here = Path(cwd, first)
    if here.is_file() and os.access(here, os.X_OK):
        return [f"./{first}", *argv[1:]], None
    if any(c.isspace() for c in first):
        return argv, (
            f"command not found: {first!r} is a command line in one string: use sh -c or"
            " split it (gpusched submit -- python train.py --lr 0.1)"
        )
    hint = _hint(first, here, path_env)
    return argv, f"command not found: {first} (not on your PATH, not in {cwd}){hint}"


def _not_runnable(path: Path, given: str) -> str | None:
    if not path.exists():
        return f"cannot run {given}: no such file"
    if path.is_dir():
        return f"cannot run {given}: it is a directory"
    if not os.access(path, os.X_OK):
        return (
            f"cannot run {given}: it is not executable"
            f" (chmod +x {given}, or name its interpreter first)"
        )
    return None


def _hint(first: str, here: Path, path_env: str | None) -> str:
    """What the user probably meant."""
    if which(f"{first}3", path_env) is not None:
        return f"; {first}3 is there: use {first}3 (Debian and Ubuntu have no plain `{first}`)"
    if here.is_file():
        return f"; ./{first} is not executable: chmod +x {first}, or name its interpreter first"
    return ""


def notify_argv(notify: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """`--notify 'notify-send "job done"'` -> ["notify-send", "job done"]; never a shell."""
    if notify is None:
        return None
    import shlex  # only a --notify needs it

    argv = shlex.split(notify) if isinstance(notify, str) else list(notify)
    if not argv or not argv[0]:
        raise UsageError("--notify: empty command")
    return tuple(argv)


def current_umask() -> int:
    """This process's umask, for its job's files (reading it means setting it: put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# A submit sent whose answer was lost (the daemon stopped answering, or its database did
# not confirm the commit) is sent again, with its request id, this many times. A refusal
# that says "nothing was changed" (the database away before any COMMIT) is no lost answer:
# it is said at once, within the request's bound, not after the retries' waits.
SUBMIT_RETRIES = 2
SUBMIT_RETRY_AFTER_S = 1.0
# This client's own words for a try sent and never answered (gpusched.connection).
DAEMON_SILENT = ("stopped answering", "closed the connection")


def is_answer_lost(exc: GpuschedError) -> bool:
    """Whether `exc` says a try was sent and its answer never came: the daemon stopped
    answering or closed the connection (this client's own DaemonUnreachable), or the
    daemon's database did not confirm its commit. Only how the message begins or ends is
    read: a refusal quotes the driver's words (libpq's "server closed the connection
    unexpectedly" as PostgreSQL restarts) and then says "nothing was changed"."""
    said = str(exc)
    if isinstance(exc, DaemonUnreachable):
        return said.startswith("the gpusched daemon at ") and any(
            f" {words}" in said for words in DAEMON_SILENT
        )
    return said.endswith(MAY_HAVE_BEEN_DONE)


def submit_fields(
    command: Sequence[str],
    *,
    suggested_mem: Callable[[tuple[str, ...]], int],
    mem: str | int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    time_limit: str | float | None = None,
    after: Sequence[int] = (),
    notify: str | Sequence[str] | None = None,
    ram: str | int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The submit request's fields (`SubmitRequest`'s keywords) for `command` from this
    process. `mem="auto"` asks `suggested_mem(argv)` (the client's estimate from
    history); a new request id unless `fields` carries one."""
    workdir = os.path.abspath(cwd if cwd is not None else os.getcwd())
    environment = dict(os.environ if env is None else env)
    argv = resolve_command(command, workdir, environment.get("PATH"))
    argv = _checked_program(argv, workdir, environment.get("PATH"), after, fields)
    if mem == "auto":
        mem = suggested_mem(tuple(argv))
    # One id for every try of this submit: the daemon answers a retry with the jobs
    # the first try made, so a retry after a lost answer never queues twice.
    request_id = fields.pop("request_id", None) or os.urandom(16).hex()
    return {
        "command": tuple(argv),
        "cwd": workdir,
        "env": environment,
        "umask": current_umask(),
        "mem": None if mem is None else parse_job_mem(mem, what="mem"),
        "time": None if time_limit is None else parse_job_time(time_limit, what="time_limit"),
        "after": tuple(after),
        "notify": notify_argv(notify),
        "request_id": request_id,
        "ram": None if ram is None else parse_job_ram(ram, what="ram"),
        **fields,
    }


def submit_request(
    command: Sequence[str], *, suggested_mem: Callable[[tuple[str, ...]], int], **options: Any
) -> SubmitRequest:
    """The submit request for `command` from this process (submit_fields' options)."""
    from gpusched.core.requests.catalog import SubmitRequest

    fields = submit_fields(command, suggested_mem=suggested_mem, **options)
    request = SubmitRequest(**fields)
    _check_script(fields)  # after the request's own checks: theirs are said first
    return request


def checked_command(command: Sequence[str], cwd: str, path_env: str | None) -> list[str]:
    """`command` as it will run, refused (UsageError) as `submit` refuses it: a program
    that can never start, or an interpreter's script that is not there (`gpusched run`)."""
    argv = resolve_command(command, cwd, path_env)
    runnable, problem = runnable_command(argv, cwd, path_env)
    problem = problem or _missing_script(runnable, cwd)
    if problem is not None:
        raise UsageError(problem)
    return runnable


def _missing_script(argv: Sequence[str], cwd: str) -> str | None:
    """Why `python3 missing.py` could never run (None: the script is there, or this is no
    interpreter given a script): said at submit, not as a failed job later."""
    if len(argv) < 2:
        return None
    script = argv[1]
    if not is_interpreter(argv[0]) or not script or script.startswith("-") or "{" in script:
        return None
    if Path(cwd, script).exists():
        return None
    return f"cannot run {script}: no such file (in {cwd})"


def _check_script(fields: dict[str, Any]) -> None:
    """UsageError for a missing script; a held job or one after others only gets a warning
    (its script may be written meanwhile)."""
    problem = _missing_script(fields["command"], fields["cwd"])
    if problem is None:
        return
    if fields.get("hold") or fields.get("after"):
        print(
            f"gpusched: warning: {shown(problem)}; queued anyway (held or --after)", file=sys.stderr
        )
        return
    raise UsageError(problem)


# SubmitRequest's fields that may be left out of submit_fields, with its defaults
# (tests/test_cli_fast.py keeps them equal to the dataclass's).
SUBMIT_DEFAULTS: dict[str, Any] = {
    "gpus": 1,
    "name": None,
    "priority": 0,
    "hold": False,
    "max_concurrent": None,
    "retry_oom": 0,
    "nodes": None,
    "requeue": False,
    "exclusive": False,
    "share": False,
    "output": None,
    "sweep": None,
    "after_when": None,
    "ram": None,
    "cpus": None,
}


def submit_frame(fields: dict[str, Any]) -> dict[str, Any]:
    """`SubmitRequest(**fields).to_wire()` without its "op" and without the request
    dataclasses: the same checks (UsageError in the same words), the same values."""
    from gpusched.core.requests.checks import check_submit

    values = {**SUBMIT_DEFAULTS, **fields}
    unknown = set(values) - set(SUBMIT_DEFAULTS) - _SUBMIT_REQUIRED
    if unknown:  # as the dataclass refuses an unexpected keyword
        raise TypeError(f"unexpected submit fields: {sorted(unknown)}")
    values["notify"], values["after"], values["after_when"] = check_submit(
        **{name: values[name] for name in _CHECKED},
    )
    _check_script(values)
    return {name: _json_value(value) for name, value in values.items()}


_SUBMIT_REQUIRED = frozenset(
    {"command", "cwd", "env", "umask", "mem", "time", "after", "notify", "request_id"}
)
_CHECKED = (
    "command",
    "cwd",
    "umask",
    "mem",
    "gpus",
    "name",
    "time",
    "max_concurrent",
    "sweep",
    "nodes",
    "exclusive",
    "share",
    "retry_oom",
    "notify",
    "after",
    "request_id",
    "after_when",
    "ram",
    "cpus",
)


def _json_value(value: Any) -> Any:
    """As requests.base.to_json_value: a tuple as a list (nested), a mapping as a dict."""
    if isinstance(value, tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return dict(value)
    return value


def send_submit(send: Callable[[], Any], request_id: str | None, socket_path: Path) -> Any:
    """The daemon's answer to `send()` (one submit request, `request_id` its id), sent
    again (the same request, so the same id) when an answer was lost."""
    retries_left = SUBMIT_RETRIES
    answer_lost = False  # a try was sent and not answered: it may have been queued
    while True:
        try:
            return send()
        except GpuschedError as exc:
            # Sent, and no answer: the jobs may be queued, or not; only a retry with
            # the same id can tell without risking a second copy.
            lost = is_answer_lost(exc)
            if lost and retries_left > 0:
                answer_lost = True
                retries_left -= 1
                time.sleep(SUBMIT_RETRY_AFTER_S)
                continue
            if not (lost or answer_lost):
                raise
            # This try's fate, or an earlier one's, is open: say so, whatever this one says.
            if lost:
                raise type(exc)(
                    f"{exc} (submit request {request_id}: it may have been queued;"
                    " `gpusched status` shows it if so)"
                ) from None
            raise type(exc)(
                f"a submit's answer was lost (the gpusched daemon at {socket_path}), and"
                f" its retry: {exc.message} (submit request {request_id}: the first try"
                " may have been queued; `gpusched status` shows it if so)"
            ) from None


def _checked_program(
    argv: list[str], cwd: str, path_env: str | None, after: Sequence[int], fields: dict[str, Any]
) -> list[str]:
    """The command as it will run (`./train.py`), or UsageError if its program can never
    start. A held job or one that waits for others only gets a warning: its program may be
    built meanwhile. A sweep's placeholder in the program's name is filled in later."""
    if fields.get("sweep") and "{" in argv[0]:
        return argv
    runnable, problem = runnable_command(argv, cwd, path_env)
    if problem is None:
        return runnable
    if fields.get("hold") or after:
        warning = shown(f"{problem}; queued anyway (held or --after)")
        print(f"gpusched: warning: {warning}", file=sys.stderr)
        return argv
    raise UsageError(problem)
