"""Time as the daemon keeps it: UTC, written as ISO 8601 text (the JSON contract's format).

`Clock` is any callable giving the wall time; `TickClock` adds the monotonic time that
measures intervals (a lease's age, a fence) whatever the wall clock does. The scheduler
is handed one (`SystemClock` in the daemon, a fixed one in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Protocol

Clock = Callable[[], datetime]


class TickClock(Protocol):
    def __call__(self) -> datetime:
        """The wall time, UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never stepping back: for intervals."""


class SystemClock:
    """This machine's clocks."""

    def __call__(self) -> datetime:
        return utc_now()

    def monotonic(self) -> float:
        return time.monotonic()


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")
