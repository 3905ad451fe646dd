"""The wall clock of a daemon in a cluster: the database's.

Servers' clocks disagree (the issue found one 2 h ahead: a job "started" 2 h after it was
submitted). A cluster daemon's context clock is this server's wall clock corrected by its
offset from the database's clock, learnt at each lease renewal (the database says when it
renewed; the offset is taken against the middle of the round trip, so it is off by at
most half of it). So every timestamp a daemon writes (submitted, started, ended) reads on
one clock, whichever server wrote it. The monotonic clock stays this server's: it times
intervals (a lease's deadline), which no offset may move.

Of the recent renewals (RECENT), the offset of the one with the shortest round trip is
kept: its error bound is the smallest. A round trip stretched by load or a lock wait (on
a busy 2-core machine, tens of milliseconds) would otherwise move every timestamp this
daemon writes by up to half of it, and a job's end, on this daemon's clock, could read
later than the next job's start on that card, written on the database's.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta

from gpusched.scheduling.context import TickClock

RECENT = 8  # renewals whose round trips are compared


class ClusterClock:
    def __init__(self, local: TickClock) -> None:
        self.local = local
        self.offset_s = 0.0  # the database's clock less this server's (0 until learnt)
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT)  # (round trip, offset)

    def __call__(self) -> datetime:
        return self.local() + timedelta(seconds=self.offset_s)

    def monotonic(self) -> float:
        return self.local.monotonic()

    def learn(self, database_s: float, sent: datetime, answered: datetime) -> None:
        """The database's time `database_s` (seconds since 1970) was read by a statement
        sent at `sent` and answered at `answered` (this server's wall clock)."""
        middle = sent + (answered - sent) / 2
        self._recent.append(((answered - sent).total_seconds(), database_s - middle.timestamp()))
        self.offset_s = min(self._recent)[1]
