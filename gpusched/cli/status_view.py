"""`gpusched status`: the requests it sends (through `Client.status_reply`) and what it
prints, for the click command (cli/views.py) and the fast path (cli/fast.py) alike.

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
    from typing import Any

    from gpusched.client import Client


WAITING_SHOWN = 200  # `status` lists this many waiting jobs and counts the rest
ENDED_SHOWN = 20  # `status --all`: this many recently ended jobs (the daemon's default)
ENDED_SHOWN_MAX = 1000  # the most the daemon lists (`--limit 0`)


def use_color() -> bool:
    """Colour on a terminal only, and never with NO_COLOR set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def fetch_status(
    client: Client,
    *,
    targets: tuple[str, ...] = (),
    as_json: bool = False,
    show_all: bool = False,
    limit: int | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The reply `status` draws: every running job, the first `limit` waiting ones and how
    many more wait (`more_waiting`), and with `show_all` the recent ends; `--json` (or
    `--limit 0`) every waiting job, `--json --limit N` the first N; given `targets` (ids,
    aN), those jobs."""
    waiting_shown = WAITING_SHOWN if limit is None else limit
    ended = ENDED_SHOWN if limit is None else limit or ENDED_SHOWN_MAX
    if targets:
        from gpusched.cli.common import parse_targets
        from gpusched.core.requests.catalog import ArrayRequest
        from gpusched.core.requests.views import ShowRequest

        result = client.status_reply(states=["running"], first=1)
        job_ids, arrays = parse_targets(targets)
        chosen = [client.send(ShowRequest(job_id)) for job_id in job_ids]
        for array_id in arrays:
            chosen.extend(client.send(ArrayRequest(array_id)))
        result["jobs"] = chosen
    elif (as_json and limit is None) or waiting_shown == 0:
        result = client.status_reply(all=show_all, user=user, ended=ended)
    else:
        result = client.status_reply(all=show_all, states=["running"], user=user, ended=ended)
        waiting = client.status_reply(states=["queued", "held"], first=waiting_shown, user=user)
        from gpusched.core.status_pages import merge_status_pages

        view = merge_status_pages(result, waiting)
        result["jobs"] = view["waiting"] + view["running"]
        result["more_waiting"] = view["more_waiting"]
    return result


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
