"""The `retention:` config block: how long what jobs leave behind is kept, and how much
one user may make the daemon store.

Nothing a job leaves may grow without bound: the daemon deletes, at each retention pass
(`every`), ended jobs older than `history` (their rows and timelines), the timelines of
ended jobs older than `timelines`, the environments of ended jobs older than
`environments` (and then every stored environment no job uses), and the logs of jobs
ended longer ago than `logs` (gpusched.store.retention, gpusched.daemon.retention).
`user_bytes_per_minute` / `user_bytes_per_day` cap what one user's submits may store
(environments, and each job's command, name, `--notify`, `--cwd` and `--output`): past
either, a submit is refused with one line. `user_log_bytes` is one user's share of
`log_dir`: past it, their oldest ended logs are removed, then their running logs cut
(gpusched.daemon.log_share). Durations are seconds and sizes bytes inside
`RetentionSettings`; null: kept forever / no cap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.units import parse_duration, parse_size

DAY_S = 86400.0
_KEYS = (
    "history",
    "environments",
    "timelines",
    "logs",
    "every",
    "user_bytes_per_minute",
    "user_bytes_per_day",
    "user_log_bytes",
)  # as the error lists them


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
    user_log_bytes: int | None = 20 * 2**30  # one user's logs in log_dir, all jobs together


# Each key: the field it sets, what it is, and what null means (None: null is refused).
# In the order they are checked, so the first bad key is the one named.
_FIELDS: dict[str, tuple[str, str, str | None]] = {
    "history": ("history_s", "duration", "keep forever"),
    "environments": ("environments_s", "duration", "keep forever"),
    "timelines": ("timelines_s", "duration", "keep forever"),
    "logs": ("logs_s", "duration", "keep forever"),
    "user_bytes_per_minute": ("user_bytes_per_minute", "size", "no cap"),
    "user_bytes_per_day": ("user_bytes_per_day", "size", "no cap"),
    "user_log_bytes": ("user_log_bytes", "size", "no share"),
    "every": ("every_s", "duration", None),
}


def _above_zero(key: str, value: Any) -> float | int | None:
    """`value` as seconds (a duration) or bytes (a size), above zero; None for a null the
    key allows."""
    _field, kind, null_means = _FIELDS[key]
    if value is None and null_means is not None:
        return None
    parse = parse_duration if kind == "duration" else parse_size
    amount = parse(value) if value is not None else 0
    if amount <= 0:
        allowed = f", or null ({null_means})" if null_means is not None else ""
        raise UsageError(f"{key}: expected a {kind} above zero{allowed}")
    return amount


def parse_retention(value: Any) -> RetentionSettings:
    """`retention: {history: 180d, environments: 7d, timelines: 90d, logs: 30d, every: 1m,
    user_bytes_per_minute: 64M, user_bytes_per_day: 2G, user_log_bytes: 20G}`; a key left
    out keeps its default."""
    if value is None:
        return RetentionSettings()
    if not isinstance(value, dict):
        raise UsageError(f"expected a mapping with {', '.join(_KEYS)}")
    unknown = sorted(set(map(str, value)) - set(_KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} (expected {', '.join(_KEYS)})")
    fields: dict[str, Any] = {
        _FIELDS[key][0]: _above_zero(key, value[key]) for key in _FIELDS if key in value
    }
    return replace(RetentionSettings(), **fields)
