"""The requests of `gpusched status` and `gpusched show`, apart from requests.catalog
(which lists them with every other operation in REQUESTS) so that the client sends them
without creating every request class first: the commands people run most start faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpusched.core.errors import UsageError
from gpusched.core.models import ACTIVE_STATES
from gpusched.core.requests.base import JobRequest, Request


@dataclass(frozen=True)
class StatusRequest(Request):
    """GPUs and one page of active jobs: after id `cursor`, at most `limit` (the daemon
    caps it), only `states` (active ones), only `user`'s jobs if given; with `all`, the
    `ended` most recent ends (default 20) on the last page."""

    op: ClassVar[str] = "status"
    all: bool = False
    cursor: int = 0
    limit: int | None = None
    states: tuple[str, ...] | None = None
    user: str | None = None
    ended: int | None = None

    def __post_init__(self) -> None:
        if self.ended is not None and self.ended < 1:
            raise UsageError("'ended': at least 1 ended job")
        if self.states is not None and not set(self.states) <= {str(s) for s in ACTIVE_STATES}:
            raise UsageError("'states': only queued, held and running jobs are paged")


@dataclass(frozen=True)
class ShowRequest(JobRequest):
    """One job; with `timeline`, also its memory and utilization over time."""

    op: ClassVar[str] = "show"
    timeline: bool = False
