"""What every part of the scheduler works with, built once and handed to each at its
construction: the three owners of truth (the store for jobs, the probe for GPUs, the
launcher for processes), the usage monitor, the clock (wall and monotonic), the config
holder, the lock that serialises passes, endings and job operations, how to ask for a
pass now (`wake`) or soon (`wake_in`) and who is told of each job's end
(`end_listeners`).

The store is passed whole here, and each part takes from it at its construction only
the parts it uses (`self.jobs = context.store.jobs`, ...): the endings jobs, usage and
attempts; the starter jobs and placements; the cluster's agent jobs, nodes and
placements; the elected scheduler nodes and placements; the usage monitor, built here,
usage and timeline.

Nothing is assigned onto a part after it is built: the daemon builds what a part calls
back (its wake-up, its hook runner) before the context, and tests build theirs with
test doubles (tests/world.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import Config
from gpusched.core.clock import utc_now
from gpusched.gpus.probe import Probe
from gpusched.processes.launching import JobLauncher
from gpusched.store import Store
from gpusched.usage.monitor import UsageMonitor


class TickClock(Protocol):
    """The pass's clock: the wall time, and the monotonic time that measures intervals (a
    lease's age, a fence) whatever the wall clock does. Here, not in core.clock: the
    command line imports that one and needs neither."""

    def __call__(self) -> datetime:
        """The wall time, UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never stepping back."""


class SystemClock:
    """This machine's clocks (the daemon's)."""

    def __call__(self) -> datetime:
        return utc_now()

    def monotonic(self) -> float:
        return time.monotonic()


# Called with a job's id once it has ended, and whether it has notification hooks to
# run; called under the lock, so each must only hand the id over.
EndListener = Callable[[int, bool], None]


def _no_wake() -> None:
    pass


def _no_wake_in(seconds: float) -> None:
    pass


@dataclass(frozen=True)
class Context:
    settings: ConfigHolder
    store: Store
    probe: Probe
    launcher: JobLauncher
    monitor: UsageMonitor
    clock: TickClock
    lock: threading.RLock
    wake: Callable[[], None]
    end_listeners: tuple[EndListener, ...]
    # A pass within this many seconds, unless one is due sooner (a job just started is
    # polled while it allocates: scheduling.starting).
    wake_in: Callable[[float], None] = _no_wake_in

    @classmethod
    def build(
        cls,
        settings: ConfigHolder,
        store: Store,
        probe: Probe,
        launcher: JobLauncher,
        *,
        clock: TickClock | None = None,
        wake: Callable[[], None] = _no_wake,
        wake_in: Callable[[float], None] = _no_wake_in,
        end_listeners: Sequence[EndListener] = (),
    ) -> Context:
        clock = clock or SystemClock()
        return cls(
            settings,
            store,
            probe,
            launcher,
            UsageMonitor(store.usage, store.timeline, monotonic=clock.monotonic),
            clock,
            threading.RLock(),
            wake,
            tuple(end_listeners),
            wake_in,
        )

    @property
    def config(self) -> Config:
        """The current config (read at each use, so a reload reaches the next pass)."""
        return self.settings.current
