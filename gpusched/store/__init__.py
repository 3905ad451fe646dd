"""The job store: SQLAlchemy Core over SQLite (WAL) by default, or a shared PostgreSQL;
the daemon is its only user (and `gpusched admin copy-database`, daemon stopped).

`Store(url)` opens the database (one `Database`: gpusched.store.database) and composes
one part per concern, each given that Database at construction; no part inherits
another, and where one needs another's write inside its transaction, it calls a module
function with the transaction's connection (`write_timeline`, `record_requeued`):
- `store.jobs` (gpusched.store.transitions `Jobs`, its reads in gpusched.store.queries
  `JobReads`): submits (what they insert: gpusched.store.submits), state changes, one
  transaction each, and every read of jobs (`Queued`, `LaunchInfo`, `JobFigures`)
- `store.usage` (gpusched.store.usage): measured usage, OOM retries, past runs' figures
- `store.timeline` (gpusched.store.timeline): each job's stored memory and utilization
- `store.nodes` (gpusched.store.nodes): the cluster's nodes and the scheduler's election
- `store.placements` (gpusched.store.placements): placements, starts and node deaths,
  conditioned on epochs
- `store.head_claims` (gpusched.store.head_claims): the cards kept for the blocked head
- `store.attempts` (gpusched.store.attempts): the earlier runs of requeued jobs, and the
  real end of such a run
Beside them:
- gpusched.store.database: the engine, read and write transactions, durability per
  transaction (its docstring says which write is FULL or NORMAL), the lease clock
- gpusched.store.schema: every table (`metadata`); gpusched.store.migrations: the Alembic
  revisions and their running at open (a newer schema refused)
- gpusched.store.rows: a `jobs` row read as a Job, and the SQL pieces the parts share
- gpusched.store.engine: connections per dialect, URLs shown without their password
- gpusched.store.space: the room an SQLite database keeps for a full disk (`check_space`,
  `disk_full`)
- gpusched.store.copy: one database's jobs into another (its own entry point)
- gpusched.store.retention: the `retention:` key, applied by the daemon's retention pass
  (and by `gpusched admin prune`, with `history` set to its age), on the Database
"""

from __future__ import annotations

from collections.abc import Callable

from gpusched.store.attempts import Attempts, RunHere, job_attempts
from gpusched.store.database import Database
from gpusched.store.engine import WRITE_WAIT_S
from gpusched.store.head_claims import HeadClaims, StoredClaim
from gpusched.store.nodes import LeaseRow, NodeRow, Nodes
from gpusched.store.placements import DownResult, NodeGuard, NodePlacement, Placements
from gpusched.store.queries import JobFigures, LaunchInfo
from gpusched.store.queued import Queued
from gpusched.store.schema import jobs, metadata, timeline_points
from gpusched.store.submits import NewJob
from gpusched.store.timeline import Timeline, TimelineRow, TimelineWrite
from gpusched.store.transitions import Jobs
from gpusched.store.usage import USAGE_COLUMNS, Usage

__all__ = [
    "USAGE_COLUMNS",
    "Attempts",
    "Database",
    "DownResult",
    "HeadClaims",
    "JobFigures",
    "Jobs",
    "LaunchInfo",
    "LeaseRow",
    "NewJob",
    "NodeGuard",
    "NodePlacement",
    "NodeRow",
    "Nodes",
    "Placements",
    "Queued",
    "RunHere",
    "Store",
    "StoredClaim",
    "Timeline",
    "TimelineRow",
    "TimelineWrite",
    "Usage",
    "job_attempts",
    "jobs",
    "metadata",
    "timeline_points",
]


class Store:
    """The database is the truth about jobs: every read and write of it goes through one
    of these parts, each given the one `Database` (its engine and transactions)."""

    def __init__(
        self,
        url: str,
        lease_clock: Callable[[], float] | None = None,
        keep_room: bool = False,
        write_wait_s: float = WRITE_WAIT_S,
    ) -> None:
        """Open (and bring to this version's schema) the database at `url`. `lease_clock`:
        seconds since 1970 for the cluster's leases, in place of the database's own
        clock (store.nodes): a test's fixed clock. `keep_room`: the daemon's room for a
        full disk beside an SQLite file (gpusched.store.space). `write_wait_s` (SQLite):
        the most a write waits for its turn and the database's lock."""
        self.database = Database(url, lease_clock, keep_room, write_wait_s)
        self.jobs = Jobs(self.database)
        self.usage = Usage(self.database)
        self.timeline = Timeline(self.database)
        self.nodes = Nodes(self.database)
        self.placements = Placements(self.database)
        self.head_claims = HeadClaims(self.database)
        self.attempts = Attempts(self.database)

    @property
    def where(self) -> str:
        """The database's URL, without its password."""
        return self.database.where

    def check_space(self) -> None:
        """Keep or give back the room kept for a full disk (gpusched.store.space)."""
        if self.database.space is not None:
            self.database.space.check()

    def disk_full(self) -> str | None:
        """Why nothing new can be stored now (its disk is full), in words; None: it can."""
        space = self.database.space
        return space.describe() if space is not None and space.full else None

    def close(self) -> None:
        self.database.close()
