"""What every request type shares (requests.catalog, .views, .interactive): the `Request`
base with its wire form, the bounds a request may not pass whatever the daemon's
config, and the small checks several requests make (a job id, a list of ids).

Each field's annotation is its wire type: `tuple[X, ...]` is a JSON list, `Mapping` a
JSON object, `X | None` may be null or absent. A field without a default is required.
gpusched.core.requests.wire reads them to parse a frame.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from gpusched.core.errors import NotFoundError, UsageError
from gpusched.core.units import MAX_DURATION_S, MIN_JOB_MEM_BYTES, MIN_JOB_TIME_S, format_size

MAX_IDS = 10_000  # job ids in one request: `wait`, `after`
MAX_NAME_CHARS = 200  # a job's name, a sweep's label included
MAX_RETRY_OOM = 10
MAX_REASON_CHARS = 500  # a drain reason is shown on every `status`
MAX_NOTIFY_ARGS = 256
MAX_NOTIFY_BYTES = 16384


class Request:
    """What every request has: its operation's name and its wire form."""

    op: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        """The frame's object: {"op": ..., field: JSON value, ...}."""
        wire: dict[str, Any] = {"op": self.op}
        for each in dataclasses.fields(self):  # type: ignore[arg-type]
            wire[each.name] = to_json_value(getattr(self, each.name))
        return wire


def to_json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [to_json_value(item) for item in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


def shape(message: str) -> dict[str, str]:
    """Field metadata: the error for a value of the wrong shape, when "has the wrong
    type" would not tell a client author what is expected."""
    return {"shape": message}


def job_id(value: int) -> None:
    if value < 1:
        raise NotFoundError(f"no job {value}")


@dataclasses.dataclass(frozen=True)
class JobRequest(Request):
    """A request about one job, named by `id` (its first field: `ShowRequest(7)`)."""

    id: int

    def __post_init__(self) -> None:
        job_id(self.id)


def unique_ids(key: str, ids: tuple[int, ...]) -> tuple[int, ...]:
    """At most MAX_IDS ids, each once, in the order first given."""
    if len(ids) > MAX_IDS:
        raise UsageError(f"'{key}': at most {MAX_IDS} job ids in one request, not {len(ids)}")
    return tuple(dict.fromkeys(ids))


def normalise(request: Request, name: str, value: Any) -> None:
    object.__setattr__(request, name, value)  # a frozen dataclass, set once in __post_init__


def check_job_spec(
    verb: str,
    *,
    command: tuple[str, ...],
    cwd: str,
    mem: int | None,
    gpus: int,
    name: str | None,
    time: float | None,
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


def check_sharing(exclusive: bool, share: bool) -> None:
    """`--exclusive` (a card to itself) and `--share` (light: shares a busy card) conflict."""
    if exclusive and share:
        raise UsageError(
            "--exclusive and --share conflict: a job wants a card to itself or shares one"
        )
