"""The store's time series of each job's memory and utilization (the `timeline_points` table).

`store.timeline` (`Timeline`) reads a job's stored points. The daemon downsamples a
running job's polls in memory (gpusched.usage.timeline) and writes what changed with the
usage flush it already makes about once a minute (`store.usage.set_usage`) and with the
job's end (`store.jobs.mark_ended`), in the same transaction: `write_timeline`, given that
transaction's connection, is the part of both that touches this table. Points are
appended; only when the daemon thins a long job's series are they replaced. The rows go
with their job's row (ON DELETE CASCADE).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from gpusched.core.models import TimelinePoint
from gpusched.store.database import Database
from gpusched.store.schema import timeline_points


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """A stored point and how many polls it stands for (to merge it fairly later)."""

    t: float  # epoch seconds of its first poll
    memory_bytes: int | None
    utilization_pct: float | None
    samples: int = 1

    def point(self) -> TimelinePoint:
        return TimelinePoint(self.t, self.memory_bytes, self.utilization_pct)


@dataclass(frozen=True)
class TimelineWrite:
    """Points to add to a job's series; `replace`: its stored points go first (thinned)."""

    points: tuple[TimelineRow, ...]
    replace: bool = False


def write_timeline(conn: Connection, job_id: int, write: TimelineWrite | None) -> None:
    """Apply `write` inside the caller's transaction."""
    if write is None:
        return
    if write.replace:
        conn.execute(delete(timeline_points).where(timeline_points.c.job_id == job_id))
    if write.points:
        conn.execute(
            timeline_points.insert(),
            [
                {
                    "job_id": job_id,
                    "t": row.t,
                    "memory": row.memory_bytes,
                    "util": row.utilization_pct,
                    "samples": row.samples,
                }
                for row in write.points
            ],
        )


class Timeline:
    """`store.timeline`: the stored points of each job's series."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def job_timeline(self, job_id: int) -> list[TimelinePoint]:
        """The job's stored points, oldest first ([] for none, or no such job).

        A running job's newest points (up to the usage flush interval, a minute) are
        still in the daemon's memory: `Scheduler.job_timeline` adds them.
        """
        return [row.point() for row in self.timeline_rows(job_id)]

    def timeline_rows(self, job_id: int) -> list[TimelineRow]:
        """The job's stored points with their poll counts, oldest first."""
        query = (
            select(
                timeline_points.c.t,
                timeline_points.c.memory,
                timeline_points.c.util,
                timeline_points.c.samples,
            )
            .where(timeline_points.c.job_id == job_id)
            .order_by(timeline_points.c.t)
        )
        with self.db.read() as conn:
            return [TimelineRow(*row) for row in conn.execute(query)]
