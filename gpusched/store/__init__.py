"""The job store: SQLAlchemy Core over SQLite (WAL) by default; the daemon is its only user.

`Store` is assembled from one class per concern, each in its own module; import from
here, which re-exports what the rest of gpusched uses:
- gpusched.store.database: the `jobs` table, rows read as Jobs, the engine, and durability per
  transaction (BEGIN IMMEDIATE, synchronous FULL or NORMAL: its docstring says which)
- gpusched.store.queries: reads (`Queued`, `LaunchInfo`, `JobFigures` for the metrics)
- gpusched.store.transitions: submits and state changes, one transaction each (`NewJob`)
- gpusched.store.usage: measured usage and OOM retries (`USAGE_COLUMNS`)
- gpusched.store.nodes: the cluster's nodes and the scheduler's election (leases)
- gpusched.store.placements: placements, starts and node deaths, conditioned on epochs
"""

from __future__ import annotations

from gpusched.store.database import jobs, metadata
from gpusched.store.nodes import LeaseRow, NodeRecords, NodeRow
from gpusched.store.placements import DownResult, NodeGuard, NodePlacement, PlacementRecords
from gpusched.store.queries import JobFigures, LaunchInfo, Queued
from gpusched.store.transitions import JobTransitions, NewJob
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
    "Store",
    "jobs",
    "metadata",
]


class Store(JobTransitions, UsageRecords, NodeRecords, PlacementRecords):
    """The database is the truth about jobs: every read and write of it goes through here."""
