"""How a frame becomes a request: `parse` checks a decoded JSON object against the
dataclass its "op" names (gpusched.core.requests.REQUESTS), field by field from each
annotation, and builds it, so that its own checks run too. Never a crash: a wrong type is
a ProtocolError, a value no job could hold (a NUL, a number past 64 bits, NaN, text that
is not UTF-8) a UsageError."""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

from gpusched.core.errors import ProtocolError, UsageError
from gpusched.core.requests.base import Request
from gpusched.core.requests.catalog import REQUESTS

# Each field's wire type, resolved once (the annotations are strings here).
_HINTS = {op: get_type_hints(kind) for op, kind in REQUESTS.items()}


def parse(frame: Mapping[str, Any]) -> Request:
    """The request a decoded frame holds; fields it does not declare are ignored.

    ProtocolError: an unknown operation, a missing field, a value of the wrong type.
    UsageError (or NotFoundError for a job id below 1): a value no request may hold.
    """
    op = frame.get("op")
    kind = REQUESTS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise ProtocolError(f"unknown request {op!r}")
    hints = _HINTS[kind.op]
    values: dict[str, Any] = {}
    for each in dataclasses.fields(kind):  # type: ignore[arg-type]
        value = frame.get(each.name)
        if value is None:
            if each.default is dataclasses.MISSING and each.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"request is missing '{each.name}'")
            continue  # null means "the default", as an absent field does
        if _holds_nul(value):
            # No path, argument, environment entry or name can hold one (the OS ends a C
            # string there); refused here, for every request, rather than deep in a stat().
            raise UsageError(f"'{each.name}' contains a NUL character (\\x00)")
        shape = each.metadata.get("shape")
        values[each.name] = _typed(each.name, value, hints[each.name], shape)
    return kind(**values)


def _typed(key: str, value: Any, hint: Any, shape: str | None) -> Any:
    """`value` as a `hint` (lists as tuples), or the field's shape error."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return None if value is None else _typed(key, value, inner[0], shape)
    if origin is None:
        return _scalar(key, value, hint, shape)
    inner_shape = shape or _wrong(key)  # an item of the wrong type: the field's shape error
    if origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(key, item, args[0], inner_shape) for item in value)
        if len(value) == len(args):
            pairs = zip(value, args, strict=True)
            return tuple(_typed(key, item, kind, inner_shape) for item, kind in pairs)
    elif origin is Mapping and isinstance(value, dict):
        key_kind, value_kind = args
        return {
            _typed(key, k, key_kind, inner_shape): _typed(key, v, value_kind, inner_shape)
            for k, v in value.items()
        }
    raise ProtocolError(inner_shape)


def _scalar(key: str, value: Any, kind: type, shape: str | None) -> Any:
    """A JSON scalar of `kind`, with what JSON allows but no job could hold refused."""
    if kind is bool and isinstance(value, bool):
        return value
    if isinstance(value, bool):  # JSON's true is not a number
        pass
    elif kind in (int, float) and isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # what a column holds; 10**400 is no float either
            given = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
            raise UsageError(
                f"'{key}' is out of range: {given} is not between {-(2**63)} and {2**63 - 1}"
            )
        return value if kind is int else float(value)
    elif kind is float and isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"'{key}' must be a finite number")  # NaN would hang `wait`
        return float(value)
    elif kind is str and isinstance(value, str):
        try:
            value.encode("utf-8")  # lone surrogates (PEP 383) fit JSON columns, not text ones
        except UnicodeEncodeError:
            raise UsageError(f"'{key}' is not valid UTF-8 text") from None
        return value
    if shape is None and kind is int:
        raise ProtocolError(f"'{key}' must be an integer")
    raise ProtocolError(shape or _wrong(key))


def _wrong(key: str) -> str:
    return f"'{key}' has the wrong type"


def _holds_nul(value: Any) -> bool:
    """A NUL in a string of `value`, its lists or its mappings (keys too), walked without
    recursion (decode() bounds the depth; this need not trust it)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, list | tuple):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
    return False
