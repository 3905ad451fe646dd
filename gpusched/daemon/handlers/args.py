"""Argument checks for the request handlers: a wrong type is the client's fault, never the
daemon's crash.

Each reader takes the request's arguments and a name, and returns a value of the right
type or raises the one-line error the client sees (ProtocolError for a malformed request,
UsageError for a value no job could hold).
"""

from __future__ import annotations

import math
from typing import Any

from gpusched.core.errors import NotFoundError, ProtocolError, UsageError
from gpusched.daemon.bounds import check_ids

MAX_RETRY_OOM = 10


def arg(
    args: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    default: Any = None,
    required: bool = False,
) -> Any:
    if key not in args or args[key] is None:
        if required:
            raise ProtocolError(f"request is missing '{key}'")
        return default
    value = args[key]
    if isinstance(value, bool) and kind is int:
        raise ProtocolError(f"'{key}' must be an integer")
    if not isinstance(value, kind):
        raise ProtocolError(f"'{key}' has the wrong type")
    check_value(key, value)
    return value


def check_value(key: str, value: Any) -> None:
    """What the JSON type allows but the database and the OS cannot hold."""
    if _holds_nul(value):
        # No path, argument, environment entry or name can hold one (the OS ends a C
        # string there); refused here, for every request, rather than deep in a stat().
        raise UsageError(f"'{key}' contains a NUL character (\\x00)")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise UsageError(f"'{key}' is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"'{key}' must be a finite number")  # NaN would make `wait` hang
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")  # lone surrogates (PEP 383) fit JSON columns, not text ones
        except UnicodeEncodeError:
            raise UsageError(f"'{key}' is not valid UTF-8 text") from None


def _holds_nul(value: Any) -> bool:
    """A NUL in a string of `value`, its lists or its mappings (keys too), walked without
    recursion (decode() bounds the depth; this need not trust it)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
    return False


def notify(args: dict[str, Any]) -> tuple[str, ...] | None:
    """`submit --notify`: an argv (the client splits the user's string with shlex)."""
    argv = str_list(args, "notify")
    if not argv:
        return None
    if not argv[0] or len(argv) > 256 or sum(map(len, argv)) > 16384:
        raise UsageError("--notify: expected a command of reasonable length")
    return tuple(argv)


def retry_oom(args: dict[str, Any]) -> int:
    retries = arg(args, "retry_oom", int, default=0)
    if not 0 <= retries <= MAX_RETRY_OOM:
        raise UsageError(f"--retry-oom must be between 0 and {MAX_RETRY_OOM}")
    return int(retries)


def job_id(args: dict[str, Any]) -> int:
    value = arg(args, "id", int, required=True)
    if value < 1:
        raise NotFoundError(f"no job {value}")
    return int(value)


def str_list(args: dict[str, Any], key: str) -> list[str]:
    value = arg(args, key, list, default=[])
    if not all(isinstance(item, str) for item in value):
        raise ProtocolError(f"'{key}' must be a list of strings")
    return value


def text(value: str) -> str:
    """For a text column: lone surrogates (undecodable bytes in argv) as \\udcXX escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def int_list(args: dict[str, Any], key: str) -> list[int]:
    """Job ids: each once, at most bounds.MAX_IDS (checked before any is looked up)."""
    value = arg(args, key, list, default=[])
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise ProtocolError(f"'{key}' must be a list of job ids")
    ids = check_ids(key, value)
    for item in ids:
        check_value(key, item)
    return ids
