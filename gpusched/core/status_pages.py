"""`status` read page by page: one page's request on the wire, and the pages joined.

Shared by the Python API (`Client.status_reply`, which builds the request as a checked
`StatusRequest`) and the CLI's fast path (cli/status_view.py), which sends the same frame
without gpusched.client and the request dataclasses (issue 30: `gpusched status` at
interpreter speed; tests/test_cli_fast.py checks the two frames are the same).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

# JobState's terminal values (core/models.py), by name: a page of active states lists the
# recent ends too when `all` asks for them.
ENDED_STATE_NAMES = frozenset({"done", "failed", "cancelled", "lost"})


def status_wire(
    all: bool = False,
    states: Sequence[str] | None = None,
    first: int | None = None,
    user: str | None = None,
    ended: int | None = None,
) -> dict[str, Any]:
    """The first page's frame, as `StatusRequest(...).to_wire()` gives it without its op."""
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
