"""`gpusched status`: the requests it sends and what it prints, shared by the click command
(cli/views.py) and the fast path (cli/fast.py), so both ask the same and print the same.

The screen is drawn (cli/render.py) from plain views of the reply's JSON
(cli/reply_view.py), not from the models' dataclasses: `gpusched status` starts without
creating them. Neither click nor the models are imported here.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Protocol

    from gpusched.connection import DaemonConnection
    from gpusched.core.requests.base import Request

    class StatusSource(Protocol):
        """What `status` asks of a client: gpusched.client.Client, or StatusReader."""

        def status_reply(
            self,
            all: bool = False,
            states: Sequence[str] | None = None,
            first: int | None = None,
            user: str | None = None,
            ended: int | None = None,
        ) -> dict[str, Any]: ...

        def request(self, op: str, **args: Any) -> Any: ...


WAITING_SHOWN = 200  # `status` lists this many waiting jobs and counts the rest
ENDED_SHOWN = 20  # `status --all`: this many recently ended jobs (the daemon's default)
ENDED_SHOWN_MAX = 1000  # the most the daemon lists (`--limit 0`)


class StatusReader:
    """`Client.status_reply` over a bare connection: the same frames (core/status_pages.py)
    without gpusched.client, its models and its request dataclasses."""

    def __init__(self, connection: DaemonConnection) -> None:
        self.connection = connection

    def status_reply(
        self,
        all: bool = False,
        states: Sequence[str] | None = None,
        first: int | None = None,
        user: str | None = None,
        ended: int | None = None,
    ) -> dict[str, Any]:
        from gpusched.core.status_pages import joined_pages, status_wire

        wire = status_wire(all=all, states=states, first=first, user=user, ended=ended)

        def page(cursor: int | None) -> dict[str, Any]:
            result: dict[str, Any] = self.connection.request(
                "status", **{**wire, "cursor": cursor or 0}
            )
            return result

        return joined_pages(page, all=all, states=states, first=first)

    def request(self, op: str, **args: Any) -> Any:
        return self.connection.request(op, **args)


def use_color() -> bool:
    """Colour on a terminal only, and never with NO_COLOR set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def fetch_status(
    client: StatusSource,
    *,
    targets: tuple[str, ...] = (),
    as_json: bool = False,
    show_all: bool = False,
    limit: int | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The reply `status` draws: every running job, the first `limit` waiting ones and how
    many more wait (`more_waiting`), and with `show_all` the recent ends; `--json` (or
    `--limit 0`) every waiting job; given `targets` (ids, aN), those jobs."""
    waiting_shown = WAITING_SHOWN if limit is None else limit
    ended = ENDED_SHOWN if limit is None else limit or ENDED_SHOWN_MAX
    if targets:
        from gpusched.cli.common import parse_targets
        from gpusched.core.requests.catalog import ArrayRequest
        from gpusched.core.requests.views import ShowRequest

        result = client.status_reply(states=["running"], first=1)
        job_ids, arrays = parse_targets(targets)
        chosen = [_sent(client, ShowRequest(job_id)) for job_id in job_ids]
        for array_id in arrays:
            chosen.extend(_sent(client, ArrayRequest(array_id)))
        result["jobs"] = chosen
    elif as_json or waiting_shown == 0:
        result = client.status_reply(all=show_all, user=user, ended=ended)
    else:
        result = client.status_reply(all=show_all, states=["running"], user=user, ended=ended)
        waiting = client.status_reply(states=["queued", "held"], first=waiting_shown, user=user)
        from gpusched.core.status_pages import merge_status_pages

        view = merge_status_pages(result, waiting)
        result["jobs"] = view["waiting"] + view["running"]
        result["more_waiting"] = view["more_waiting"]
    return result


def _sent(client: StatusSource, request: Request) -> Any:
    """A request object sent through the client's `request`: its checks ran as it was
    built, and its wire form is the one `Client.send` would send."""
    wire = request.to_wire()
    return client.request(wire.pop("op"), **wire)


def terminal_columns() -> int:
    """`shutil.get_terminal_size((80, 24)).columns` without importing shutil (its import
    is a few ms of every `gpusched status`): $COLUMNS, else stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def status_json(result: dict[str, Any]) -> str:
    """`status --json`: the interface contract's shape (DESIGN.md), no paging fields."""
    shape = ("gpus", "jobs", "drain", "nodes")
    return json_text({key: result[key] for key in shape if key in result})


def json_text(value: Any) -> str:
    """What every `--json` prints (without its final newline)."""
    return json.dumps(value, indent=2, sort_keys=False)


def status_text(result: dict[str, Any], show_all: bool, color: bool) -> str:
    """The status screen for this terminal's width."""
    from gpusched.cli.render import render_status
    from gpusched.cli.reply_view import gpu_view, job_view

    drain = nodes = None
    if result.get("drain") is not None or len(result.get("nodes") or ()) > 1:
        from gpusched.core.models import Drain, NodeStatus  # rare: drained, or a cluster

        drain = None if result.get("drain") is None else Drain.from_json(result["drain"])
        nodes = [NodeStatus.from_json(n) for n in result.get("nodes", [])]
    return render_status(
        [gpu_view(g) for g in result["gpus"]],
        [job_view(j) for j in result["jobs"]],
        width=terminal_columns(),
        color=color,
        show_all=show_all,
        drain=drain,
        more_waiting=result.get("more_waiting", 0),
        nodes=nodes or [],
    )
