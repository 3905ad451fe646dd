"""The `interactive:` config block: limits for `gpusched run` and `gpusched.claim()`.

A forgotten notebook must not hold a card forever: interactive jobs get a default time
limit (and at most `max_time`), each user may hold only so many at once, and one that
leaves its GPU idle for `idle_timeout` is flagged in `status` (and, with `on_idle: end`,
ended). Durations are seconds inside `InteractiveSettings` (units in the names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.units import parse_duration

_KEYS = ("default_time", "max_time", "max_per_user", "idle_timeout", "on_idle")


@dataclass(frozen=True)
class InteractiveSettings:
    """None everywhere: no limit (the default)."""

    default_time_s: float | None = None  # the --time of a run or claim that gives none
    max_time_s: float | None = None  # a longer --time is refused
    max_per_user: int | None = None  # interactive jobs running at once per user; more wait
    idle_timeout_s: float | None = None  # no GPU utilization this long: idle
    on_idle: str = "warn"  # or "end": an idle interactive job is ended (reason `idle`)


def _duration(key: str, value: Any) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds <= 0:
        raise UsageError(f"{key}: expected a duration above zero, or null")
    return seconds


def parse_interactive(value: Any) -> InteractiveSettings:
    """`interactive: {default_time: 8h, max_per_user: 2, idle_timeout: 1h, on_idle: warn}`."""
    if value is None:
        return InteractiveSettings()
    if not isinstance(value, dict):
        raise UsageError(f"expected a mapping with {', '.join(_KEYS)}")
    unknown = sorted(set(map(str, value)) - set(_KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} (expected {', '.join(_KEYS)})")
    cap = value.get("max_per_user")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
        raise UsageError("max_per_user: expected a whole number >= 0, or null")
    on_idle = value.get("on_idle", "warn")
    if on_idle not in ("warn", "end"):
        raise UsageError("on_idle: expected 'warn' or 'end'")
    settings = InteractiveSettings(
        default_time_s=_duration("default_time", value.get("default_time")),
        max_time_s=_duration("max_time", value.get("max_time")),
        max_per_user=cap,
        idle_timeout_s=_duration("idle_timeout", value.get("idle_timeout")),
        on_idle=on_idle,
    )
    if (
        settings.default_time_s is not None
        and settings.max_time_s is not None
        and settings.default_time_s > settings.max_time_s
    ):
        raise UsageError("default_time is longer than max_time")
    if settings.on_idle == "end" and settings.idle_timeout_s is None:
        raise UsageError("on_idle: end needs an idle_timeout")
    return settings
