"""The checks of a request's fields that are plain functions (no dataclass): the bounds a
request may not pass whatever the daemon's config, a job id, a list of ids, what a batch
or interactive job declares, a submit request id, and a submit's checks as a whole
(`check_submit`, what `SubmitRequest` runs as it is built).

Apart from requests.base (which re-exports them) so that the CLI's fast path
(cli/fast.py) checks a submit with the same code and words without creating the request
dataclasses, so that `gpusched submit` starts at interpreter speed. Standard library only,
and neither dataclasses nor typing at run time.
"""

from __future__ import annotations

import os
import re

from gpusched.core.after import AFTER_CONDITIONS, AFTER_OK
from gpusched.core.errors import NotFoundError, ProtocolError, UsageError
from gpusched.core.units import (
    MAX_DURATION_S,
    MAX_SIZE_BYTES,
    MIN_JOB_MEM_BYTES,
    MIN_JOB_RAM_BYTES,
    MIN_JOB_TIME_S,
    format_size,
)

TYPE_CHECKING = False  # typing's own import costs every `gpusched submit`
if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_IDS = 10_000  # job ids in one request: `wait`, `after`
MAX_NAME_CHARS = 200  # a job's name, a sweep's label included
MAX_RETRY_OOM = 10
MAX_REASON_CHARS = 500  # a drain reason is shown on every `status`
MAX_NOTIFY_ARGS = 256
MAX_NOTIFY_BYTES = 16384
MAX_JOB_CPUS = 4096  # `--cpus`: past any server's cores, a number is a typo

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # as config's `node:`
# A submit's request id (the client makes one per submit, a uuid4's hex): 8 to 64 of these.
_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


def job_id(value: int) -> None:
    if value < 1:
        raise NotFoundError(f"no job {value}")


def unique_ids(key: str, ids: tuple[int, ...]) -> tuple[int, ...]:
    """At most MAX_IDS ids, each once, in the order first given."""
    if len(ids) > MAX_IDS:
        raise UsageError(f"'{key}': at most {MAX_IDS} job ids in one request, not {len(ids)}")
    return tuple(dict.fromkeys(ids))


def unique_after(
    after: tuple[int, ...], after_when: tuple[str, ...] | None
) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """`after` each id once (`unique_ids`) and `after_when` its conditions (core.after),
    one per id in `after`'s order, None when every one is `ok`. An id given twice with
    two conditions is refused: both cannot hold."""
    if after_when is None:
        return unique_ids("after", after), None
    if len(after_when) != len(after):
        raise ProtocolError("'after_when' must give one condition per id of 'after'")
    unique_ids("after", after)  # the bound
    conditions: dict[int, str] = {}
    for dep, when in zip(after, after_when, strict=True):
        if when not in AFTER_CONDITIONS:
            raise UsageError(f"--after {dep}:{when}: expected one of {', '.join(AFTER_CONDITIONS)}")
        if conditions.setdefault(dep, when) != when:
            raise UsageError(f"--after {dep}: given as {conditions[dep]} and as {when}")
    kept = tuple(conditions.values())
    return tuple(conditions), None if all(when == AFTER_OK for when in kept) else kept


def check_request_id(value: str | None) -> None:
    if value is not None and not _REQUEST_ID.fullmatch(value):
        raise ProtocolError("'request_id' must be 8 to 64 letters, digits, '-' or '_'")


def check_job_spec(
    verb: str,
    *,
    command: tuple[str, ...],
    cwd: str,
    mem: int | None,
    gpus: int,
    name: str | None,
    time: float | None,
    ram: int | None = None,
    cpus: int | None = None,
) -> None:
    """What a batch job (`submit`) and an interactive one (`run`) both declare."""
    if not command or not command[0]:
        raise UsageError(f"no command given: gpusched {verb} [OPTIONS] -- COMMAND [ARGS...]")
    if not os.path.isabs(cwd):
        raise UsageError(f"working directory must be an absolute path, not {cwd!r}")
    if mem is not None and mem <= 0:
        raise UsageError("--mem must be more than zero")
    if mem is not None and mem < MIN_JOB_MEM_BYTES:
        raise UsageError(
            f"--mem {mem} bytes: at least {format_size(MIN_JOB_MEM_BYTES, tabular=False)}"
            " (a CUDA context alone takes a few hundred MB)"
        )
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise UsageError(f"--name is limited to {MAX_NAME_CHARS} characters")
    if time is not None and not time > 0:
        raise UsageError("--time must be more than zero")
    if time is not None and time < MIN_JOB_TIME_S:
        raise UsageError(f"--time {time:g}s: too short (at least {MIN_JOB_TIME_S:g}s)")
    if time is not None and time >= MAX_DURATION_S:
        raise UsageError(f"--time {time:g}s: too long (must be under 1e9 seconds, about 31 years)")
    check_host_ask(ram, cpus)


def check_host_ask(ram: int | None, cpus: int | None) -> None:
    """`--ram` (host memory, bytes) and `--cpus` (cores) as any server could give them."""
    if ram is not None and not MIN_JOB_RAM_BYTES <= ram <= MAX_SIZE_BYTES:
        least = format_size(MIN_JOB_RAM_BYTES, tabular=False)
        raise UsageError(f"--ram {ram} bytes: at least {least} and at most 1024T")
    if cpus is not None and not 1 <= cpus <= MAX_JOB_CPUS:
        raise UsageError(f"--cpus {cpus}: expected a number of cores from 1 to {MAX_JOB_CPUS}")


def check_sharing(exclusive: bool, share: bool) -> None:
    """`--exclusive` (a card to itself) and `--share` (light: shares a busy card) conflict."""
    if exclusive and share:
        raise UsageError(
            "--exclusive and --share conflict: a job wants a card to itself or shares one"
        )


def check_submit(
    *,
    command: tuple[str, ...],
    cwd: str,
    umask: int,
    mem: int | None,
    gpus: int,
    name: str | None,
    time: float | None,
    max_concurrent: int | None,
    sweep: object,
    nodes: Sequence[str] | None,
    exclusive: bool,
    share: bool,
    retry_oom: int,
    notify: tuple[str, ...] | None,
    after: tuple[int, ...],
    request_id: str | None,
    after_when: tuple[str, ...] | None = None,
    ram: int | None = None,
    cpus: int | None = None,
) -> tuple[tuple[str, ...] | None, tuple[int, ...], tuple[str, ...] | None]:
    """A submit's checks (requests.catalog.SubmitRequest's), in its order, and its
    `notify`, `after` and `after_when` as the request keeps them (an empty notify: none;
    each id once, with its condition; no conditions when all are `ok`)."""
    check_request_id(request_id)
    check_job_spec(
        "submit",
        command=command,
        cwd=cwd,
        mem=mem,
        gpus=gpus,
        name=name,
        time=time,
        ram=ram,
        cpus=cpus,
    )
    if not 0 <= umask <= 0o777:
        raise ProtocolError("'umask' must be between 0 and 0o777")
    if max_concurrent is not None and max_concurrent < 1:
        raise UsageError("--max-concurrent must be at least 1")
    if max_concurrent is not None and sweep is None:
        raise UsageError("--max-concurrent applies to a --sweep array")
    if (nodes is not None and not all(NODE_NAME.fullmatch(node) for node in nodes)) or nodes == ():
        raise UsageError("--node takes node names separated by commas, such as gpu1,gpu2")
    check_sharing(exclusive, share)
    if not 0 <= retry_oom <= MAX_RETRY_OOM:
        raise UsageError(f"--retry-oom must be between 0 and {MAX_RETRY_OOM}")
    if notify == ():
        notify = None  # an empty argv: no hook
    elif notify is not None and (
        not notify[0] or len(notify) > MAX_NOTIFY_ARGS or sum(map(len, notify)) > MAX_NOTIFY_BYTES
    ):
        raise UsageError("--notify: expected a command of reasonable length")
    return notify, *unique_after(after, after_when)
