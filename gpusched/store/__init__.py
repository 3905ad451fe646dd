"""The job store: SQLAlchemy Core over SQLite (WAL) by default, or a shared PostgreSQL;
the daemon is its only user (and `gpusched admin copy-database`, daemon stopped).

`Store` is assembled from one class per concern, each in its own module; import from
here, which re-exports what the rest of gpusched uses:
- gpusched.store.database: the `jobs` table, rows read as Jobs, and durability per
  transaction (BEGIN IMMEDIATE, synchronous FULL or NORMAL: its docstring says which)
- gpusched.store.engine: connections per dialect, URLs shown without their password
- gpusched.store.schema: the schema brought to this version at open (Alembic revisions in
  gpusched/store/migrations), a newer one refused
- gpusched.store.copy: one database's jobs into another (its own entry point)
- gpusched.store.queries: reads (`Queued`, `LaunchInfo`, `JobFigures` for the metrics)
- gpusched.store.transitions: submits and state changes, one transaction each
- gpusched.store.submits: what a submit inserts, once per request id (`NewJob`)
- gpusched.store.usage: measured usage and OOM retries (`USAGE_COLUMNS`)
- gpusched.store.timeline: each job's memory and utilization over time (`TimelineRow`,
  `TimelineWrite`; written with the usage flush and the end)
- gpusched.store.nodes: the cluster's nodes and the scheduler's election (leases)
- gpusched.store.placements: placements, starts and node deaths, conditioned on epochs
- gpusched.store.attempts: the earlier runs of requeued jobs (`job_attempts`)
- gpusched.store.head_claims: the cards kept for the blocked head job, between passes
- gpusched.store.retention: the `retention:` key, applied by the daemon's retention pass
  (and by `gpusched admin prune`, with `history` set to its age)
"""

from __future__ import annotations

from gpusched.store.attempts import AttemptRecords, RunHere, job_attempts
from gpusched.store.database import jobs, metadata, timeline_points
from gpusched.store.head_claims import HeadClaimRecords, StoredClaim
from gpusched.store.nodes import LeaseRow, NodeRecords, NodeRow
from gpusched.store.placements import DownResult, NodeGuard, NodePlacement, PlacementRecords
from gpusched.store.queries import JobFigures, LaunchInfo, Queued
from gpusched.store.submits import NewJob
from gpusched.store.timeline import TimelineRecords, TimelineRow, TimelineWrite
from gpusched.store.transitions import JobTransitions
from gpusched.store.usage import USAGE_COLUMNS, UsageRecords

__all__ = [
    "USAGE_COLUMNS",
    "DownResult",
    "JobFigures",
    "LaunchInfo",
    "LeaseRow",
    "NewJob",
    "NodeGuard",
    "NodePlacement",
    "NodeRow",
    "Queued",
    "RunHere",
    "Store",
    "StoredClaim",
    "TimelineRow",
    "TimelineWrite",
    "job_attempts",
    "jobs",
    "metadata",
    "timeline_points",
]


class Store(
    JobTransitions,
    UsageRecords,
    TimelineRecords,
    NodeRecords,
    PlacementRecords,
    HeadClaimRecords,
    AttemptRecords,
):
    """The database is the truth about jobs: every read and write of it goes through here."""
