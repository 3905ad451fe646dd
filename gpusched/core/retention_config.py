"""The `retention:` config block: how long what jobs leave behind is kept, and how much
one user may make the daemon store.

Nothing a job leaves may grow without bound: the daemon deletes, at each retention pass
(`every`), ended jobs older than `history` (their rows and timelines), the timelines of
ended jobs older than `timelines`, the environments of ended jobs older than
`environments` (and then every stored environment no job uses), and the logs of jobs
ended longer ago than `logs` (gpusched.store.retention, gpusched.daemon.retention).
`user_bytes_per_minute` / `user_bytes_per_day` cap what one user's submits may store
(environments and commands): past either, a submit is refused with one line. Durations
are seconds and sizes bytes inside `RetentionSettings`; null: kept forever / no cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.units import parse_duration, parse_size

DAY_S = 86400.0
_DURATIONS = ("history", "environments", "timelines", "logs")
_SIZES = ("user_bytes_per_minute", "user_bytes_per_day")
_KEYS = (*_DURATIONS, "every", *_SIZES)


@dataclass(frozen=True)
class RetentionSettings:
    """The defaults are docs/operations.md's ("Retention")."""

    history_s: float | None = 180 * DAY_S  # ended jobs' rows (status --all, usage, fair share)
    environments_s: float | None = 7 * DAY_S  # an ended job's environment (requeue uses it)
    timelines_s: float | None = 90 * DAY_S  # an ended job's memory/utilization series
    logs_s: float | None = 30 * DAY_S  # an ended job's log file
    every_s: float = 60.0  # how often the daemon applies the above (and removes job dirs)
    user_bytes_per_minute: int | None = 64 * 2**20  # stored by one user's submits
    user_bytes_per_day: int | None = 2 * 2**30


def _duration(key: str, value: Any) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds <= 0:
        raise UsageError(f"{key}: expected a duration above zero, or null (keep forever)")
    return seconds


def _size(key: str, value: Any) -> int | None:
    if value is None:
        return None
    size = parse_size(value)
    if size <= 0:
        raise UsageError(f"{key}: expected a size above zero, or null (no cap)")
    return size


def parse_retention(value: Any) -> RetentionSettings:
    """`retention: {history: 180d, environments: 7d, timelines: 90d, logs: 30d, every: 1m,
    user_bytes_per_minute: 64M, user_bytes_per_day: 2G}`; a key left out keeps its default."""
    if value is None:
        return RetentionSettings()
    if not isinstance(value, dict):
        raise UsageError(f"expected a mapping with {', '.join(_KEYS)}")
    unknown = sorted(set(map(str, value)) - set(_KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} (expected {', '.join(_KEYS)})")
    base = RetentionSettings()
    fields: dict[str, Any] = {}
    for key in _DURATIONS:
        if key in value:
            fields[f"{key}_s"] = _duration(key, value[key])
    for key in _SIZES:
        if key in value:
            fields[key] = _size(key, value[key])
    if "every" in value:
        every = _duration("every", value["every"])
        if every is None:
            raise UsageError("every: expected a duration above zero")
        fields["every_s"] = every
    return RetentionSettings(**{**base.__dict__, **fields})
