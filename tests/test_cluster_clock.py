"""A cluster daemon's wall clock (gpusched.scheduling.cluster.clock): this server's, set
to the database's by the offset learnt at each lease renewal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpusched.scheduling.cluster.clock import RECENT, ClusterClock
from tests.fakes import FixedClock

AHEAD_S = 10.0  # the database's clock is this far ahead of this server's


def renew(clock: ClusterClock, sent: datetime, round_trip_s: float) -> None:
    """A renewal whose statement read the database's clock right after it was sent (as
    when the write then waits on a lock): the worst case for the middle of the trip."""
    clock.learn(
        (sent + timedelta(seconds=AHEAD_S)).timestamp(),
        sent,
        sent + timedelta(seconds=round_trip_s),
    )


def test_a_slow_round_trip_does_not_move_the_clock_by_half_of_it() -> None:
    clock = ClusterClock(FixedClock())
    start = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
    renew(clock, start, 0.002)
    assert clock.offset_s == pytest.approx(AHEAD_S - 0.001, abs=1e-6)
    # Under load a renewal took 200 ms: taken alone its middle is 100 ms off, and a job's
    # end on this clock would read 100 ms late against a start on the database's.
    renew(clock, start + timedelta(seconds=2), 0.2)
    assert clock.offset_s == pytest.approx(AHEAD_S - 0.001, abs=1e-6)
    # The fast sample is forgotten after RECENT newer ones: a clock that was stepped since
    # is followed, from the best of what is recent.
    for i in range(RECENT):
        renew(clock, start + timedelta(seconds=4 + 2 * i), 0.004 + 0.001 * i)
    assert clock.offset_s == pytest.approx(AHEAD_S - 0.002, abs=1e-6)
