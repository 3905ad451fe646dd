"""`status` read page by page: one page's request on the wire, the pages joined, and the
running and waiting pages a person reads merged into one view (the one place that does).

`Client.status_reply` (the Python API's and the CLI's) sends these frames, checked as
`StatusRequest` checks its fields, without creating the request dataclasses, so that
`gpusched status` starts at interpreter speed; the daemon reads them as `StatusRequest`
(tests/test_client.py compares the two).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from gpusched.core.requests.replies import StatusView

# JobState's terminal values (core/models.py), by name: a page of active states lists the
# recent ends too when `all` asks for them.
ENDED_STATE_NAMES = frozenset({"done", "failed", "cancelled", "lost"})
ACTIVE_STATE_NAMES = frozenset({"queued", "held", "running"})  # ACTIVE_STATES, by name


def check_status_ask(states: Sequence[str] | None, ended: int | None) -> None:
    """UsageError for what no `status` page may ask (`StatusRequest`'s checks)."""
    from gpusched.core.errors import UsageError

    if ended is not None and ended < 1:
        raise UsageError("'ended': at least 1 ended job")
    if states is not None and not {str(s) for s in states} <= ACTIVE_STATE_NAMES:
        raise UsageError("'states': only queued, held and running jobs are paged")


def status_wire(
    all: bool = False,
    states: Sequence[str] | None = None,
    first: int | None = None,
    user: str | None = None,
    ended: int | None = None,
) -> dict[str, Any]:
    """The first page's frame, as `StatusRequest(...).to_wire()` gives it without its op."""
    check_status_ask(states, ended)
    return {
        "all": all,
        "cursor": 0,
        "limit": None if first is None else max(1, first),
        "states": None if states is None else list(states),
        "user": user,
        "ended": ended,
    }


def joined_pages(
    send_page: Callable[[int | None], dict[str, Any]],
    *,
    all: bool = False,
    states: Sequence[str] | None = None,
    first: int | None = None,
) -> dict[str, Any]:
    """The reply with every page's jobs (at most `first`): `send_page(None)` asks for the
    first page, `send_page(cursor)` for the one after `cursor`."""
    result = send_page(None)
    jobs = list(result["jobs"])
    while result.get("next") is not None and (first is None or len(jobs) < first):
        result = {**result, **send_page(result["next"])}
        jobs += result["jobs"]
    if states is not None:  # an older daemon sends every state
        wanted = set(states) | (ENDED_STATE_NAMES if all else set())
        jobs = [j for j in jobs if j.get("state") in wanted]
    result.pop("next", None)
    return {**result, "jobs": jobs if first is None else jobs[:first]}


def merge_status_pages(running: Mapping[str, Any], waiting: Mapping[str, Any]) -> StatusView:
    """The `status` a person reads (the CLI's screen, the dashboard) from the running jobs
    and the first waiting ones, asked apart (StatusPages, or Client.status_reply's). GPUs,
    nodes and drain are the running reply's (an older daemon may send no nodes or drain:
    none, then)."""
    counts = waiting.get("counts") or {}
    listed = len(waiting["jobs"])
    return {
        "gpus": running["gpus"],
        "nodes": running.get("nodes") or [],
        "drain": running.get("drain"),
        "counts": counts,
        "running": running["jobs"],
        "waiting": waiting["jobs"],
        "more_waiting": max(0, counts.get("queued", 0) + counts.get("held", 0) - listed),
    }
