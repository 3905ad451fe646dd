"""The daemon's request handlers: one function per request, the flat table that names
them (HANDLERS), and `dispatch`, the server's one call into them.

A handler gets the `Services` (scheduler, store, current config, authorisation rules),
the caller and its request, parsed and checked as gpusched.core.requests.catalog declares it; it
adds the checks that need the daemon (configured bounds, the caller's rights), returns a
JSON-able value or raises a GpuschedError, and never touches the socket: server.py reads
the frame, identifies the caller, calls `dispatch` and writes the reply.

Modules: args.py (strings made fit for text columns), jobs.py (requests that change jobs), views.py
(requests that read them), admin.py (ping, drain), interactive.py (`gpusched run`, claim()).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpusched.core.errors import ProtocolError
from gpusched.core.requests.protocol import (
    VERSION,
    VERSION_FIELD,
    compatible_versions,
    version_mismatch,
)
from gpusched.core.requests.replies import Reply
from gpusched.core.requests.wire import parse
from gpusched.daemon.auth import check_served
from gpusched.daemon.handlers import admin, interactive, jobs, views
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services

# Each handler takes its operation's request type (gpusched.core.requests.catalog) and
# returns its reply type (gpusched.core.requests.replies.REPLIES); the table is keyed by
# `op`, so the request a handler gets is always the one it declares.
Handler = Callable[[Services, Caller, Any], Reply]

HANDLERS: dict[str, Handler] = {
    "ping": admin.ping,
    "submit": jobs.submit,
    "submitted": jobs.submitted,
    "status": views.status,
    "show": views.show,
    "logs": views.logs,
    "cancel": jobs.cancel,
    "hold": jobs.hold,
    "release": jobs.release,
    "wait": views.wait,
    "history": views.history,
    "priority": jobs.priority,
    "change": jobs.change,
    "requeue": jobs.requeue,
    "array": views.array,
    "estimate_history": views.estimate_history,
    "drain": admin.drain,
    "top": admin.top,
    "prune": admin.prune,
    "reload": admin.reload,
    "run": interactive.run,
    "placement": interactive.placement,
    "run_ended": interactive.run_ended,
}


def dispatch(services: Services, caller: Caller, frame: dict[str, Any]) -> Any:
    """The handler's answer to a decoded frame, or its GpuschedError.

    The caller is checked before the frame is parsed: a user the daemon does not serve
    learns nothing, not even whether their request was well formed."""
    check_served(caller, services.owner_uid)
    client_version = frame.get(VERSION_FIELD)
    if (
        isinstance(client_version, str)
        and frame.get("op") != "ping"  # how any client learns the daemon's version
        and not compatible_versions(client_version, VERSION)
    ):
        raise ProtocolError(version_mismatch(client_version, VERSION))
    request = parse(frame)
    return HANDLERS[request.op](services, caller, request)
