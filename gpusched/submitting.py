"""A submit from the client's side: the request built in the submitting process (its
command resolved and checked as it would run here, its environment and umask, sizes and
durations parsed), and sent so that an answer lost on the way never queues the jobs twice
(one request id for every try; the daemon answers a retry with what the first try made).

Used by gpusched.client's submit methods, imported only when submitting: `status` and
`show` start without it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpusched.core.errors import DaemonUnreachable, GpuschedError, UsageError
from gpusched.core.requests import catalog as rq
from gpusched.core.sanitize import shown
from gpusched.core.units import parse_job_mem, parse_job_time
from gpusched.submitter import current_umask, notify_argv, resolve_command, runnable_command

# A submit sent whose answer was lost (the daemon stopped answering, or its database did
# not confirm the commit) is sent again, with its request id, this many times.
SUBMIT_RETRIES = 2
SUBMIT_RETRY_AFTER_S = 1.0
ANSWER_LOST = ("stopped answering", "closed the connection", "is unavailable (")


def submit_request(
    command: Sequence[str],
    *,
    suggested_mem: Callable[[tuple[str, ...]], int],
    mem: str | int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    time_limit: str | float | None = None,
    after: Sequence[int] = (),
    notify: str | Sequence[str] | None = None,
    **fields: Any,
) -> rq.SubmitRequest:
    """The submit request for `command` from this process. `mem="auto"` asks
    `suggested_mem(argv)` (the client's estimate from history); a new request id unless
    `fields` carries one."""
    workdir = os.path.abspath(cwd if cwd is not None else os.getcwd())
    environment = dict(os.environ if env is None else env)
    argv = resolve_command(command, workdir, environment.get("PATH"))
    argv = _checked_program(argv, workdir, environment.get("PATH"), after, fields)
    if mem == "auto":
        mem = suggested_mem(tuple(argv))
    # One id for every try of this submit: the daemon answers a retry with the jobs
    # the first try made, so a retry after a lost answer never queues twice.
    request_id = fields.pop("request_id", None) or os.urandom(16).hex()
    return rq.SubmitRequest(
        command=tuple(argv),
        cwd=workdir,
        env=environment,
        umask=current_umask(),
        mem=None if mem is None else parse_job_mem(mem, what="mem"),
        time=None if time_limit is None else parse_job_time(time_limit, what="time_limit"),
        after=tuple(after),
        notify=notify_argv(notify),
        request_id=request_id,
        **fields,
    )


def send_submit(
    send: Callable[[rq.SubmitRequest], Any], request: rq.SubmitRequest, socket_path: Path
) -> Any:
    """The daemon's answer to `request`, sent again (same id) when an answer was lost."""
    request_id = request.request_id
    retries_left = SUBMIT_RETRIES
    answer_lost = False  # a try was sent and not answered: it may have been queued
    while True:
        try:
            return send(request)
        except GpuschedError as exc:
            # Sent, and no answer: the jobs may be queued, or not; only a retry with
            # the same id can tell without risking a second copy.
            lost = any(words in str(exc) for words in ANSWER_LOST)
            if not lost and not (answer_lost and isinstance(exc, DaemonUnreachable)):
                raise
            if not lost:  # the retry could not even connect: the first try's fate is open
                raise DaemonUnreachable(
                    f"the gpusched daemon at {socket_path} stopped answering a submit,"
                    f" and then: {exc.message} (submit request {request_id}: it may have"
                    " been queued; `gpusched status` shows it if so)"
                ) from None
            if retries_left == 0:
                raise type(exc)(
                    f"{exc} (submit request {request_id}: it may have been queued;"
                    " `gpusched status` shows it if so)"
                ) from None
            answer_lost = True
            retries_left -= 1
            time.sleep(SUBMIT_RETRY_AFTER_S)


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
