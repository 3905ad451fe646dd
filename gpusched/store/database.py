"""The store's database: the `jobs` table, how its rows become Jobs, and its transactions.

The database is the truth about jobs. Every state change is one short transaction: on
SQLite it starts with BEGIN IMMEDIATE, so concurrent writers queue on the lock (with a
busy timeout) instead of failing with "database is locked" half way through; on
PostgreSQL a change of state is a conditional UPDATE (READ COMMITTED re-checks its
condition after waiting on the row's lock) and submits queue on an advisory lock
(`lock_submits`). A submit is acknowledged only once its row is committed
(synchronous=FULL; on PostgreSQL, synchronous_commit as the server is set, on by default).
The tables are made and upgraded by gpusched.store.schema; the columns below are the head
revision's (tests/test_schema.py compares them).

Durability, per transaction. In WAL mode synchronous=FULL fsyncs the WAL at every
commit; NORMAL does not (the WAL is synced at the next FULL commit or checkpoint).
Either way a commit survives a crash of the daemon (it is in the OS's page cache) and
the database stays consistent after a power cut; NORMAL only risks that the *last*
transactions before a power cut or kernel crash are rolled back. Everything a user
is told (submit, cancel, hold, release, priority) and the claim that a job starts
(mark_running) are FULL. Three of the daemon's own per-job writes are NORMAL, because
a power cut kills every job anyway and the next start reconciles what they recorded
(JobEndings.adopt_running) from facts that do survive, or the loss is harmless:
- set_pid: lost, the row is `running` with no pid; no supervisor survives a power cut,
  so the job's fate comes from its exit record (fsynced by the supervisor) or, with
  none, it is `lost`. It is never queued again after a reboot (adopt_running checks
  the boot id), since a missing log proves nothing once the page cache is gone.
- mark_ended with the supervisor's outcome: lost, the row is `running` again; the
  outcome is re-read from the same fsynced exit record. Only ended_at moves (to the
  restart) and a notification hook may run a second time.
- hooks_started (a job's notification hooks are starting): lost, they run again at the
  next start.
Each NORMAL commit is made durable by the next FULL one (the WAL is one sequence), so
the window is short while jobs flow: the next job's mark_running closes it. On PostgreSQL
the same three writes commit with synchronous_commit off, the same trade: the WAL is
flushed a moment later, by the server, and the next durable commit covers them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    select,
    type_coerce,
)
from sqlalchemy.engine import Connection, CursorResult, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select

from gpusched.core.models import Job, JobState
from gpusched.store import schema
from gpusched.store.engine import describe_url, is_disconnect, make_engine, unavailable

log = logging.getLogger("gpusched.store")

# The database and the files SQLite keeps beside it (the WAL holds recent rows in full).
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String, nullable=True),
    Column("user", String, nullable=False),
    Column("uid", Integer, nullable=False),
    Column("gid", Integer, nullable=False),
    Column("state", String, nullable=False, index=True),
    Column("command", JSON, nullable=False),
    Column("cwd", Text, nullable=False),
    Column("env", JSON, nullable=False),
    Column("umask", Integer, nullable=False),
    Column("mem", BigInteger, nullable=True),  # bytes: past 2**31 (PostgreSQL's INTEGER)
    Column("gpus", Integer, nullable=False),
    Column("gpu_indices", JSON, nullable=False, default=list),
    Column("gpu_uuids", JSON, nullable=False, default=list),
    Column("priority", Integer, nullable=False, default=0),
    Column("after", JSON, nullable=False, default=list),
    Column("submitted_at", String, nullable=False),
    Column("started_at", String, nullable=True),
    Column("ended_at", String, nullable=True, index=True),
    Column("pid", Integer, nullable=True),
    Column("pid_start_time", String, nullable=True),  # guards against pid reuse
    Column("exit_code", Integer, nullable=True),
    Column("reason", String, nullable=True),
    Column("reason_detail", Text, nullable=True),
    Column("stop_intent", String, nullable=True),  # a StopIntent, while a running job stops
    Column("log_path", Text, nullable=True),
    Column("peak_mem", BigInteger, nullable=True),
    Column("mean_util", Integer, nullable=True),
    Column("hints", JSON, nullable=False, default=list),
    Column("util_min", Integer, nullable=True),
    Column("util_max", Integer, nullable=True),
    Column("util_stddev", Float, nullable=True),
    Column("overrun_at", String, nullable=True),
    Column("retry_oom", Integer, nullable=True),  # OOM retries left
    Column("retry_of", Integer, nullable=True),  # an OOM retry: the first attempt's id
    Column("retried_as", Integer, nullable=True),
    Column("usage_state", JSON, nullable=True),  # the daemon's UsageTracker, between restarts
    Column("array_id", Integer, nullable=True, index=True),  # jobs of one --sweep share it
    Column("array_index", Integer, nullable=True),
    Column("max_concurrent", Integer, nullable=True),  # per array
    Column("time_limit_s", Float, nullable=True),
    Column("notify", JSON, nullable=True),  # argv run as the owner when the job ends
    # How that hook ended: {"kind", "exit_code", "output" (its last words)}; NULL until then.
    Column("notify_result", JSON, nullable=True),
    # `submit --output PATH`: where the job's log goes (a template: {id}, {array},
    # {index}), opened by the job's owner; NULL: log_dir/ID.log (gpusched.core.output).
    Column("output", Text, nullable=True),
    # 1 from a job's end until its notification hooks start: they survive a restart.
    Column("hooks_due", Integer, nullable=True),
    # The job's environment in `envs` (then `env` is {}); NULL for rows written before.
    Column("env_id", Integer, nullable=True),
    # The cluster (store.nodes): the node it is placed on, that node's epoch when it was
    # placed (a write from an older epoch is refused), where it may go, and whether a
    # dead node's job goes back to the queue.
    Column("node", String, nullable=True, index=True),
    Column("node_epoch", Integer, nullable=True),
    Column("allowed_nodes", JSON, nullable=True),
    Column("requeue", Integer, nullable=True),
    # Why a queued job waits, as the cluster's scheduler last said (others read it here).
    Column("waiting_reason", Text, nullable=True),
    # 1: `gpusched run` / claim(); its pid and pid_start_time are its client's, from the
    # socket's peer credentials at the request, set while it waits too.
    Column("interactive", Integer, nullable=True),
    # Placement (policy rule 3 and the order): 1: --exclusive (a card to itself); 1:
    # --share (light, whatever it measures); `gpusched top`'s rank (lower first).
    Column("exclusive", Integer, nullable=True),
    Column("share", Integer, nullable=True),
    Column("top", Integer, nullable=True),
    # Measured (gpusched.usage.demand): its share of a card's busy time (0.0-1.0), the busy
    # jobs it took turns with on a saturated card, and its speed then against alone.
    Column("demand", Float, nullable=True),
    Column("shared_with", JSON, nullable=True),
    Column("sharing_speed", Float, nullable=True),
    # The client's id of the submit that made it (issue 26): a submit retried after its
    # answer was lost finds this job instead of making a second. NULL: none was sent.
    Column("request_id", String, nullable=True, index=True, unique=True),
)

# Environments, stored once each and shared by every job submitted with the same one:
# a 10,000-job sweep stores its submitter's environment once, not 10,000 times, and a
# user's successive submits from one shell share a row. Keyed by a digest of the content.
envs = Table(
    "envs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("digest", String, nullable=False, unique=True),
    Column("env", JSON, nullable=False),
)

# Each job's memory and utilization over time, downsampled by the daemon as the job runs
# (gpusched.usage.timeline: at most about 1,000 points a job). `t`: epoch seconds of the
# point's first poll; `samples`: how many polls it stands for. Deleted with the job's row.
# WITHOUT ROWID on SQLite: the rows live in the primary key's b-tree, no second index.
timeline_points = Table(
    "timeline_points",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("t", Float, primary_key=True),
    Column("memory", BigInteger, nullable=True),  # bytes, over all the job's GPUs
    Column("util", Float, nullable=True),  # 0-100
    Column("samples", Integer, nullable=False),
    sqlite_with_rowid=False,
)

# -- rows read as Jobs ------------------------------------------------------------------

# The columns a Job shows: the model's fields that are stored (waiting_reason is not;
# it is the scheduler's, computed each pass). Derived, so a field added to both stays in step.
_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job) if f.name in jobs.c)

# A Job's JSON columns, read as text and decoded by to_job: most are "[]" on a queued
# job, and SQLAlchemy's JSON type runs json.loads on each (five per job, for every
# queued job at every scheduling pass: most of a pass's time with a long queue).
_JSON_FIELDS = tuple(name for name in _JOB_FIELDS if isinstance(jobs.c[name].type, JSON))


# The columns a Job shows: everything but the environment, the heaviest column, so that
# a scheduling pass over thousands of queued jobs does not load their environments. Built
# once (statements are immutable; .where() makes new ones).
_JOB_SELECT = select(
    *(
        type_coerce(jobs.c[name], Text).label(name) if name in _JSON_FIELDS else jobs.c[name]
        for name in _JOB_FIELDS
    )
)


def job_select() -> Select[Any]:
    return _JOB_SELECT


def decode_json(text: str | None) -> Any:
    if not isinstance(text, str):  # None, or psycopg decoded PostgreSQL's json already
        return text
    return [] if text == "[]" else json.loads(text)


# pg_advisory_xact_lock's key for "adding jobs" (schema.py's upgrade lock is another).
_SUBMIT_LOCK = 0x67707375


def lock_submits(conn: Connection) -> None:
    """Make this transaction the only one adding jobs until it ends.

    A submit reads before it writes: the owner's waiting jobs (max_queued), the next array
    id, whether its environment is stored. On SQLite, BEGIN IMMEDIATE already serialises
    writers; on PostgreSQL (READ COMMITTED) two submits would both read the same, so they
    queue on an advisory lock, released at commit.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(_SUBMIT_LOCK)))


def inserted_id(result: CursorResult[Any]) -> int:
    """The id of the job row an INSERT just created."""
    key = result.inserted_primary_key
    if key is None:  # only for a statement that inserted nothing, which ours never are
        raise RuntimeError("the insert returned no primary key")
    return int(key[0])


def to_job(row: Row[Any]) -> Job:
    # By position (rows of job_select): a scheduling pass converts every queued job.
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = decode_json(values[name])
    values["state"] = JobState(values["state"])
    for flag in ("interactive", "exclusive", "share"):
        values[flag] = bool(values[flag])  # NULL on older rows
    return Job(**values)


# -- the engine ---------------------------------------------------------------------------


def make_private(path: Path) -> None:
    """Take group and other access away from the database and SQLite's files beside it.

    They hold every job's command and environment (tokens, keys). The daemon creates
    them 0600, but one it finds may be wider: a backup restored with `cp`, a file made
    by hand or by an older version; SQLite gives its -wal and -shm the database's mode.
    O_NOFOLLOW: a link planted at one of these names is left alone, never chmodded.
    """
    for suffix in SQLITE_SUFFIXES:
        name = path.with_name(path.name + suffix)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(name, flags)
        except OSError:  # absent (the usual case), or a link: nothing of ours to tighten
            continue
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
                os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o700)
                log.warning(
                    "%s was readable by others (mode %o): made private (%o)",
                    name,
                    stat.S_IMODE(info.st_mode),
                    stat.S_IMODE(info.st_mode) & 0o700,
                )
        except OSError as exc:
            log.warning("cannot make %s private: %s", name, exc.strerror)
        finally:
            os.close(fd)


class Database:
    """The engine and its two kinds of transaction, shared by every part of `Store` (each
    part is given this object at its construction)."""

    def __init__(self, url: str, lease_clock: Callable[[], float] | None = None) -> None:
        """`lease_clock`: seconds since 1970 for the cluster's leases, in place of the
        database's own clock (store.nodes): a test's fixed clock."""
        self.where = describe_url(url)
        self.lease_clock = lease_clock
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            path = Path(url.removeprefix("sqlite:///"))
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not path.exists():
                path.touch(mode=0o600)
            make_private(path)
        self.engine = make_engine(url)
        try:
            schema.upgrade(self.engine, self.where)
        except DBAPIError as exc:
            self.engine.dispose()
            if is_disconnect(exc):
                raise unavailable(exc, self.where) from None
            raise
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        self.engine.dispose()

    def read(self) -> Connection:
        """A connection for reading: no write lock is taken (see _on_begin)."""
        return self.engine.connect().execution_options(gpusched_read=True)

    @contextlib.contextmanager
    def write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction; `durable=False`: synchronous=NORMAL (module docstring)."""
        if durable:
            with self.engine.begin() as conn:
                yield conn
            return
        relaxed = self.engine.connect().execution_options(gpusched_relaxed=True)
        with relaxed as conn, conn.begin():
            if conn.dialect.name == "postgresql":  # the same trade as SQLite's NORMAL
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            yield conn
