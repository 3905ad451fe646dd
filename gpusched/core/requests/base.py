"""What every request type shares (requests.catalog, .views, .interactive): the `Request`
base with its wire form; the bounds a request may not pass whatever the daemon's config
and the small checks several requests make (a job id, a list of ids) are requests.checks',
re-exported here.

Each field's annotation is its wire type: `tuple[X, ...]` is a JSON list, `Mapping` a
JSON object, `X | None` may be null or absent. A field without a default is required.
gpusched.core.requests.wire reads them to parse a frame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from gpusched.core.requests.checks import (  # the plain checks, re-exported for the requests
    MAX_IDS,
    MAX_NAME_CHARS,
    MAX_NOTIFY_ARGS,
    MAX_NOTIFY_BYTES,
    MAX_REASON_CHARS,
    MAX_RETRY_OOM,
    check_job_spec,
    check_sharing,
    job_id,
    unique_ids,
)

__all__ = [
    "MAX_IDS",
    "MAX_NAME_CHARS",
    "MAX_NOTIFY_ARGS",
    "MAX_NOTIFY_BYTES",
    "MAX_REASON_CHARS",
    "MAX_RETRY_OOM",
    "JobRequest",
    "Request",
    "check_job_spec",
    "check_sharing",
    "job_id",
    "normalise",
    "shape",
    "to_json_value",
    "unique_ids",
]


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


@dataclasses.dataclass(frozen=True)
class JobRequest(Request):
    """A request about one job, named by `id` (its first field: `ShowRequest(7)`)."""

    id: int

    def __post_init__(self) -> None:
        job_id(self.id)


def normalise(request: Request, name: str, value: Any) -> None:
    object.__setattr__(request, name, value)  # a frozen dataclass, set once in __post_init__
