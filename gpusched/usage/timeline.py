"""A running job's time series, downsampled as it grows. Pure: no I/O, no clock.

The usage monitor adds one sample per poll (the memory the job's processes hold, summed
over its GPUs, and its utilization) to the job's `TimelineBuffer`, which keeps:

- one point per poll for the first `FINE_WINDOW_S` (the start, where a job's memory
  climbs and its first steps show whether it waits for data),
- then one point per `COARSE_S` bucket (a minute),
- and never more than `MAX_POINTS`: when a point would go past it, every point so far is
  merged into buckets twice as wide (again if need be) until half the cap is left, and
  new points use the wider buckets. A 72-hour job ends with a few hundred points.

A point that stands for several polls keeps the highest memory among them (the peak
survives every merge, and it is what a job is sized by) and their mean utilization.
Buckets are counted from the job's first sample, so a merge only ever joins neighbours.

The store holds what the buffer has handed over (`pending` / `committed`): closed points
are appended at each usage flush, the last (still filling) one only at the job's end, and
after a merge the whole series is replaced once. A daemon that restarts picks the
series up from the store (`restore`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpusched.core.models import TimelinePoint
from gpusched.store import TimelineRow, TimelineWrite

FINE_WINDOW_S = 300.0
COARSE_S = 60.0
MAX_POINTS = 1000


def merge(first: TimelineRow, second: TimelineRow) -> TimelineRow:
    """One point for both: the first's time, the higher memory, the mean utilization."""
    memories = [m for m in (first.memory_bytes, second.memory_bytes) if m is not None]
    utils = [(u, r.samples) for r in (first, second) if (u := r.utilization_pct) is not None]
    util = None
    if utils:
        util = round(sum(u * n for u, n in utils) / sum(n for _, n in utils), 1)
    return TimelineRow(
        first.t, max(memories) if memories else None, util, first.samples + second.samples
    )


def rebucket(rows: Iterable[TimelineRow], start_s: float, width_s: float) -> list[TimelineRow]:
    """Merge neighbouring points that fall in the same `width_s` bucket from `start_s`."""
    out: list[TimelineRow] = []
    last_bucket = None
    for row in rows:
        bucket = math.floor((row.t - start_s) / width_s)
        if out and bucket == last_bucket:
            out[-1] = merge(out[-1], row)
        else:
            out.append(row)
            last_bucket = bucket
    return out


class TimelineBuffer:
    """One running job's downsampled series and what of it the store has.

    Points are immutable and replaced, never changed in place, so another thread may
    copy `points` (a `show` while the scheduler polls) and see each point whole.
    """

    def __init__(
        self,
        start_s: float,
        *,
        width_s: float = 0.0,
        rows: Sequence[TimelineRow] = (),
        max_points: int = MAX_POINTS,
    ) -> None:
        self.start_s = start_s
        self.width_s = width_s  # 0: one point per poll (the first minutes)
        self.max_points = max_points
        self.points: list[TimelineRow] = list(rows)
        self.written = len(self.points)  # points[:written] are stored as they are
        self.rewrite = False  # the stored points were merged here: replace them all

    @classmethod
    def restore(
        cls, state: Mapping[str, Any] | None, rows: Sequence[TimelineRow]
    ) -> TimelineBuffer:
        """The buffer of a job a previous daemon watched: `to_state()` and its stored rows."""
        state = state or {}
        start = state.get("start_s")
        if not isinstance(start, (int, float)):
            start = rows[0].t if rows else None
        width = state.get("width_s")
        return cls(
            math.nan if start is None else float(start),
            width_s=float(width) if isinstance(width, (int, float)) else 0.0,
            rows=rows,
        )

    def to_state(self) -> dict[str, float]:
        """What `restore` needs besides the stored rows (kept in the job's usage state).
        No start before the first sample: JSON has no NaN, and PostgreSQL refuses one."""
        if math.isnan(self.start_s):
            return {"width_s": self.width_s}
        return {"start_s": self.start_s, "width_s": self.width_s}

    def add(self, t: float, memory_bytes: int | None, utilization_pct: float | None) -> None:
        """One poll's sample at epoch time `t`."""
        if math.isnan(self.start_s):
            self.start_s = t
        util = None if utilization_pct is None else round(float(utilization_pct), 1)
        row = TimelineRow(t, memory_bytes, util)
        last = self.points[-1] if self.points else None
        open_last = last is not None and len(self.points) > self.written
        if last is not None and t <= last.t:  # the clock stepped back: not a new point
            if open_last:
                self.points[-1] = merge(last, TimelineRow(last.t, memory_bytes, util))
            return
        if self.width_s < COARSE_S and t - self.start_s >= FINE_WINDOW_S:
            self.width_s = COARSE_S
        if (
            open_last
            and last is not None
            and self.width_s > 0
            and self._bucket(last.t) == self._bucket(t)
        ):
            self.points[-1] = merge(last, row)
            return
        self.points.append(row)
        if len(self.points) > self.max_points:
            self._thin()

    def _bucket(self, t: float) -> int:
        return math.floor((t - self.start_s) / self.width_s)

    def _thin(self) -> None:
        """Merge every point into buckets twice as wide until half the cap is left."""
        points, width = self.points, self.width_s
        target = self.max_points // 2
        while len(points) > target:
            if width > 0:
                width *= 2
            else:  # still one point per poll: buckets of the mean spacing so far, doubled
                width = 2 * max(points[-1].t - self.start_s, 1e-3) / len(points)
            points = rebucket(points, self.start_s, width)
        self.points, self.width_s = points, width
        self.written, self.rewrite = 0, True

    def pending(self, final: bool = False) -> TimelineWrite | None:
        """What the store lacks: the closed points not yet written (all with `final`).

        Hand it to the store, then call `committed` with it (if the write fails, the
        next flush sends it again).
        """
        end = len(self.points) if final else max(0, len(self.points) - 1)
        if end <= self.written and not self.rewrite:
            return None
        return TimelineWrite(tuple(self.points[self.written : end]), replace=self.rewrite)

    def committed(self, write: TimelineWrite) -> None:
        self.written = (0 if write.replace else self.written) + len(write.points)
        if write.replace:
            self.rewrite = False

    def snapshot(self) -> list[TimelinePoint]:
        """Every point so far, oldest first (written or not)."""
        return [row.point() for row in list(self.points)]
