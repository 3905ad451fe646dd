"""The requests of `gpusched status` and `gpusched show`, apart from requests.catalog
(which lists them with every other operation in REQUESTS) so that the client sends them
without creating every request class first: the commands people run most start faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpusched.core.requests.base import JobRequest, Request
from gpusched.core.status_pages import check_status_ask


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
        check_status_ask(self.states, self.ended)


@dataclass(frozen=True)
class ShowRequest(JobRequest):
    """One job; with `timeline`, also its memory and utilization over time."""

    op: ClassVar[str] = "show"
    timeline: bool = False
