"""The daemon's request handlers: one function per request, the flat table that names
them (HANDLERS), the arguments each request may carry (FIELDS), and `dispatch`, the
server's one call into them.

A handler gets the `Services` (scheduler, store, current config, authorisation rules),
the caller and the request's arguments; it checks every argument it reads, returns a
JSON-able value or raises a GpuschedError, and never touches the socket: server.py reads
the request, identifies the caller, calls `dispatch` and writes the reply.

Modules: args.py (argument checks), jobs.py (requests that change jobs), views.py
(requests that read them), admin.py (ping, drain), interactive.py (`gpusched run`, claim()).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpusched.core.errors import ProtocolError
from gpusched.daemon.auth import check_served
from gpusched.daemon.handlers import admin, interactive, jobs, views
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services

Handler = Callable[[Services, Caller, dict[str, Any]], Any]

HANDLERS: dict[str, Handler] = {
    "ping": admin.ping,
    "submit": jobs.submit,
    "status": views.status,
    "show": views.show,
    "logs": views.logs,
    "cancel": jobs.cancel,
    "hold": jobs.hold,
    "release": jobs.release,
    "wait": views.wait,
    "history": views.history,
    "priority": jobs.priority,
    "requeue": jobs.requeue,
    "array": views.array,
    "estimate_history": views.estimate_history,
    "drain": admin.drain,
    "run": interactive.run,
    "placement": interactive.placement,
    "run_ended": interactive.run_ended,
}

# The arguments each request's handler reads (besides "op"); others are ignored. Kept
# next to HANDLERS so a new field is declared where the protocol is: the fuzz test
# (tests/test_protocol_fuzz.py) sends junk in every one, and tests/test_handlers.py
# checks that a handler reads no argument missing from here.
FIELDS: dict[str, frozenset[str]] = {
    "ping": frozenset(),
    "submit": frozenset(
        {
            "after",
            "command",
            "cwd",
            "env",
            "gpus",
            "hold",
            "max_concurrent",
            "mem",
            "name",
            "notify",
            "priority",
            "retry_oom",
            "sweep",
            "time",
            "umask",
        }
    ),
    "status": frozenset({"all", "cursor", "limit", "states"}),
    "show": frozenset({"id"}),
    "logs": frozenset({"id", "max_bytes", "offset"}),
    "cancel": frozenset({"array", "id", "mine", "waiting_only"}),
    "hold": frozenset({"id"}),
    "release": frozenset({"id"}),
    "wait": frozenset({"ids", "timeout"}),
    "history": frozenset({"limit", "since", "states", "user"}),
    "priority": frozenset({"id", "priority"}),
    "requeue": frozenset({"id"}),
    "array": frozenset({"array"}),
    "estimate_history": frozenset({"command"}),
    "drain": frozenset({"on", "reason"}),
    "run": frozenset({"command", "cwd", "gpus", "mem", "name", "priority", "time"}),
    "placement": frozenset({"id", "timeout"}),
    "run_ended": frozenset({"exit_code", "id", "signal"}),
}


def dispatch(services: Services, caller: Caller, request: dict[str, Any]) -> Any:
    """The handler's answer to `request` (a decoded frame), or its GpuschedError."""
    op = request.get("op")
    handler = HANDLERS.get(op) if isinstance(op, str) else None
    if handler is None:
        raise ProtocolError(f"unknown request {op!r}")
    check_served(caller, services.owner_uid)
    return handler(services, caller, request)
