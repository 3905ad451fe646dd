"""The job store: SQLAlchemy Core over SQLite (WAL) by default; the daemon is its only user.

The database is the truth about jobs. Every state change is one short transaction
that starts with BEGIN IMMEDIATE, so concurrent writers queue on SQLite's lock (with
a busy timeout) instead of failing with "database is locked" half way through, and
a submit is acknowledged only once its row is committed (synchronous=FULL).

Durability, per transaction. In WAL mode synchronous=FULL fsyncs the WAL at every
commit; NORMAL does not (the WAL is synced at the next FULL commit or checkpoint).
Either way a commit survives a crash of the daemon (it is in the OS's page cache) and
the database stays consistent after a power cut; NORMAL only risks that the *last*
transactions before a power cut or kernel crash are rolled back. Everything a user
is told (submit, cancel, hold, release, priority) and the claim that a job starts
(mark_running) are FULL. Two of the daemon's own per-job writes are NORMAL, because
a power cut kills every job anyway and the next start reconciles what they recorded
(JobEndings.adopt_running) from facts that do survive:
- set_pid: lost, the row is `running` with no pid; no supervisor survives a power cut,
  so the job's fate comes from its exit record (fsynced by the supervisor) or, with
  none, it is `lost`. It is never queued again after a reboot (adopt_running checks
  the boot id), since a missing log proves nothing once the page cache is gone.
- mark_ended with the supervisor's outcome: lost, the row is `running` again; the
  outcome is re-read from the same fsynced exit record. Only ended_at moves (to the
  restart) and a notification hook may run a second time.
Each NORMAL commit is made durable by the next FULL one (the WAL is one sequence), so
the window is short while jobs flow: the next job's mark_running closes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    inspect,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection, Row
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql import Select

from gpusched.errors import NotFoundError
from gpusched.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobState

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
    Column("mem", Integer, nullable=True),
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
    Column("log_path", Text, nullable=True),
    Column("peak_mem", Integer, nullable=True),
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
)

# The columns a Job shows: the model's fields that are stored (waiting_reason is not;
# it is the scheduler's, computed each pass). Derived, so a field added to both stays in step.
_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job) if f.name in jobs.c)


@dataclass(frozen=True)
class NewJob:
    """What a submit stores: the job's spec and its owner's identity."""

    user: str
    uid: int
    gid: int
    command: list[str]
    cwd: str
    env: dict[str, str]
    umask: int
    mem: int | None
    gpus: int = 1
    name: str | None = None
    priority: int = 0
    after: tuple[int, ...] = ()
    held: bool = False
    retry_oom: int = 0  # `submit --retry-oom N`
    time_limit_s: float | None = None
    notify: tuple[str, ...] | None = None  # `submit --notify`: argv run when the job ends
    max_concurrent: int | None = None  # for the jobs of one array


@dataclass(frozen=True)
class Queued:
    """What a scheduling pass needs of a queued job (Store.queued): a pass reads every
    queued job, so it reads these columns only, not the whole Job."""

    id: int
    user: str
    mem: int | None
    gpus: int
    priority: int
    after: list[int]
    array_id: int | None
    max_concurrent: int | None
    retry_of: int | None


_QUEUED_SELECT = select(
    *(
        type_coerce(jobs.c[f.name], Text) if f.name == "after" else jobs.c[f.name]
        for f in dataclasses.fields(Queued)
    )
).where(jobs.c.state == str(JobState.QUEUED))


@dataclass(frozen=True)
class LaunchInfo:
    """The parts of a job only the launcher needs (never sent to clients)."""

    gid: int
    env: dict[str, str]
    umask: int
    pid_start_time: str | None


# What measuring a job may write (Store.set_usage, mark_ended's `usage`).
USAGE_COLUMNS = frozenset(
    {
        "peak_mem",
        "mean_util",
        "util_min",
        "util_max",
        "util_stddev",
        "hints",
        "overrun_at",
        "usage_state",
    }
)

# Columns that describe one run of a job: an OOM retry starts them afresh.
_PER_RUN_COLUMNS = frozenset(
    {
        "id",
        "state",
        "gpu_indices",
        "gpu_uuids",
        "started_at",
        "ended_at",
        "pid",
        "pid_start_time",
        "exit_code",
        "reason",
        "reason_detail",
        "log_path",
        "retried_as",
        *USAGE_COLUMNS,
    }
)


def _usage_values(values: dict[str, Any]) -> dict[str, Any]:
    unknown = set(values) - USAGE_COLUMNS
    if unknown:
        raise ValueError(f"not a usage column: {sorted(unknown)}")
    return dict(values)


# A Job's JSON columns, read as text and decoded by _to_job: most are "[]" on a queued
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


def _job_select() -> Select[Any]:
    return _JOB_SELECT


def _json(text: str | None) -> Any:
    if text is None:
        return None
    return [] if text == "[]" else json.loads(text)


def _to_job(row: Row[Any]) -> Job:
    # By position (rows of _job_select): a scheduling pass converts every queued job.
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = _json(values[name])
    values["state"] = JobState(values["state"])
    return Job(**values)


def _sqlite_setup(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE for every transaction (the pysqlite recipe)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED, which can
        # fail with "database is locked" at the first write instead of waiting.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writes take the write lock up front; reads take none (WAL readers never block
        # writers), so a slow status or history cannot make a submit wait.
        options = connection.get_execution_options()
        if options.get("gpusched_read", False):
            connection.exec_driver_sql("BEGIN")
            return
        # The level sticks to the pooled connection: set it only when it changes.
        wanted = "NORMAL" if options.get("gpusched_relaxed", False) else "FULL"
        if connection.info.get("synchronous", "FULL") != wanted:
            connection.exec_driver_sql(f"PRAGMA synchronous={wanted}")
            connection.info["synchronous"] = wanted
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _add_missing_columns(engine: Engine) -> None:
    """Add the columns `jobs` gained since this database was created.

    create_all() creates missing tables only; a database from an older gpusched lacks the
    newer (always nullable) columns, and old rows read them as NULL.
    """
    present = {column["name"] for column in inspect(engine).get_columns("jobs")}
    missing = [column for column in jobs.columns if column.name not in present]
    if not missing:
        return
    with engine.begin() as conn:
        for column in missing:
            ddl = CreateColumn(column).compile(dialect=engine.dialect)
            conn.exec_driver_sql(f"ALTER TABLE jobs ADD COLUMN {ddl}")


class Store:
    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            path = Path(url.removeprefix("sqlite:///"))
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not path.exists():
                path.touch(mode=0o600)
        self.engine = create_engine(url)
        if self.engine.dialect.name == "sqlite":
            _sqlite_setup(self.engine)
        metadata.create_all(self.engine)
        _add_missing_columns(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def read(self) -> Connection:
        """A connection for reading: no write lock is taken (see _on_begin)."""
        return self.engine.connect().execution_options(gpusched_read=True)

    @contextlib.contextmanager
    def _write(self, durable: bool = True) -> Iterator[Connection]:
        """One write transaction; `durable=False`: synchronous=NORMAL (module docstring)."""
        if durable:
            with self.engine.begin() as conn:
                yield conn
            return
        relaxed = self.engine.connect().execution_options(gpusched_relaxed=True)
        with relaxed as conn, conn.begin():
            yield conn

    # -- reads -------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        with self.read() as conn:
            row = conn.execute(_job_select().where(jobs.c.id == job_id)).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return _to_job(row)

    def get_many(self, job_ids: Iterable[int]) -> dict[int, Job]:
        ids = list(job_ids)
        with self.read() as conn:
            rows = conn.execute(_job_select().where(jobs.c.id.in_(ids))).all()
        return {row.id: _to_job(row) for row in rows}

    def launch_info(self, job_id: int) -> LaunchInfo:
        with self.read() as conn:
            row = conn.execute(
                select(jobs.c.gid, jobs.c.env, jobs.c.umask, jobs.c.pid_start_time).where(
                    jobs.c.id == job_id
                )
            ).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return LaunchInfo(row.gid, dict(row.env), row.umask, row.pid_start_time)

    def active(self) -> list[Job]:
        """Queued, held and running jobs, in submit order."""
        states = [str(s) for s in ACTIVE_STATES]
        with self.read() as conn:
            rows = conn.execute(
                _job_select().where(jobs.c.state.in_(states)).order_by(jobs.c.id)
            ).all()
        return [_to_job(row) for row in rows]

    def running(self) -> list[Job]:
        with self.read() as conn:
            rows = conn.execute(
                _job_select().where(jobs.c.state == str(JobState.RUNNING)).order_by(jobs.c.id)
            ).all()
        return [_to_job(row) for row in rows]

    def queued(self) -> list[Queued]:
        """Queued jobs (not held), in submit order, with what a scheduling pass needs."""
        with self.read() as conn:
            rows = conn.execute(_QUEUED_SELECT.order_by(jobs.c.id)).all()
        return [
            Queued(i, u, m, g, p, _json(a), ai, mc, ro) for i, u, m, g, p, a, ai, mc, ro in rows
        ]

    def ended(self, limit: int, user: str | None = None) -> list[Job]:
        """Ended jobs, most recently ended first."""
        query = _job_select().where(jobs.c.state.in_([str(s) for s in TERMINAL_STATES]))
        if user is not None:
            query = query.where(jobs.c.user == user)
        query = query.order_by(jobs.c.ended_at.desc(), jobs.c.id.desc()).limit(limit)
        with self.read() as conn:
            return [_to_job(row) for row in conn.execute(query).all()]

    def count_waiting(self, uid: int) -> int:
        """How many of a user's jobs are queued or held (for `max_queued`)."""
        waiting = [str(JobState.QUEUED), str(JobState.HELD)]
        query = select(func.count()).where(jobs.c.uid == uid, jobs.c.state.in_(waiting))
        with self.read() as conn:
            return int(conn.execute(query).scalar_one())

    def count(self) -> int:
        with self.read() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())

    # -- writes: one transaction each ---------------------------------------------------

    def add(self, new: NewJob, now: str) -> Job:
        return self.add_many([new], now, as_array=False)[0]

    def add_many(self, news: Sequence[NewJob], now: str, as_array: bool = True) -> list[Job]:
        """Insert jobs in one transaction; as an array, they share a new array id."""
        with self.engine.begin() as conn:
            array_id = None
            if as_array:
                top = conn.execute(select(func.max(jobs.c.array_id))).scalar()
                array_id = (top or 0) + 1
            ids = [
                self._insert(conn, new, now, array_id, index if as_array else None)
                for index, new in enumerate(news)
            ]
            rows = conn.execute(_job_select().where(jobs.c.id.in_(ids)).order_by(jobs.c.id)).all()
        return [_to_job(row) for row in rows]

    @staticmethod
    def _insert(
        conn: Connection, new: NewJob, now: str, array_id: int | None, array_index: int | None
    ) -> int:
        result = conn.execute(
            jobs.insert().values(
                name=new.name,
                user=new.user,
                uid=new.uid,
                gid=new.gid,
                state=str(JobState.HELD if new.held else JobState.QUEUED),
                command=list(new.command),
                cwd=new.cwd,
                env=dict(new.env),
                umask=new.umask,
                mem=new.mem,
                gpus=new.gpus,
                gpu_indices=[],
                gpu_uuids=[],
                priority=new.priority,
                after=list(new.after),
                submitted_at=now,
                hints=[],
                array_id=array_id,
                array_index=array_index,
                max_concurrent=new.max_concurrent,
                retry_oom=new.retry_oom,
                time_limit_s=new.time_limit_s,
                notify=list(new.notify) if new.notify else None,
            )
        )
        return int(result.inserted_primary_key[0])

    def _transition(
        self,
        job_id: int,
        from_states: Sequence[JobState],
        values: dict[str, Any],
        durable: bool = True,
    ) -> bool:
        """Apply `values` only if the job is still in one of `from_states` (compare-and-set)."""
        with self._write(durable) as conn:
            result = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state.in_([str(s) for s in from_states]))
                .values(**values)
            )
        return result.rowcount == 1

    def mark_running(
        self,
        job_id: int,
        *,
        gpu_indices: Sequence[int],
        gpu_uuids: Sequence[str],
        pid: int | None,
        pid_start_time: str | None,
        log_path: str,
        now: str,
    ) -> bool:
        # Durable (FULL): this is the claim, made before the job's supervisor exists, that
        # the job may have started. Lost in a power cut, the job would be queued again
        # and could run twice.
        return self._transition(
            job_id,
            [JobState.QUEUED],
            {
                "state": str(JobState.RUNNING),
                "gpu_indices": list(gpu_indices),
                "gpu_uuids": list(gpu_uuids),
                "pid": pid,
                "pid_start_time": pid_start_time,
                "log_path": log_path,
                "started_at": now,
            },
        )

    def unmark_running(self, job_id: int) -> bool:
        """Back to queued: a `running` job whose command provably never started."""
        return self._transition(
            job_id,
            [JobState.RUNNING],
            {
                "state": str(JobState.QUEUED),
                "gpu_indices": [],
                "gpu_uuids": [],
                "pid": None,
                "pid_start_time": None,
                "log_path": None,
                "started_at": None,
            },
        )

    def mark_ended(
        self,
        job_id: int,
        *,
        state: JobState,
        reason: str,
        now: str,
        exit_code: int | None = None,
        detail: str | None = None,
        log_path: str | None = None,
        usage: dict[str, Any] | None = None,
        durable: bool = True,
    ) -> bool:
        """End an active job; False if it had already ended (the first ending wins).

        `usage`: the job's final figures (peak, utilization, hints), written with the end.
        `durable=False` only for an ending read from the supervisor's exit record, which
        a restart can read again (module docstring).
        """
        values: dict[str, Any] = {
            **_usage_values(usage or {}),
            "state": str(state),
            "reason": reason,
            "ended_at": now,
            "exit_code": exit_code,
            "reason_detail": detail,
        }
        if log_path is not None:
            values["log_path"] = log_path
        return self._transition(job_id, list(ACTIVE_STATES), values, durable)

    def set_pid(self, job_id: int, pid: int, pid_start_time: str) -> None:
        # Not durable (NORMAL): after a power cut no supervisor is left to find by its pid.
        with self._write(durable=False) as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(pid=pid, pid_start_time=pid_start_time)
            )

    def set_detail(self, job_id: int, detail: str) -> None:
        """Note on an active job what its end will be explained by (e.g. who cancelled it)."""
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(reason_detail=detail))

    def set_priority(self, job_id: int, priority: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED, JobState.HELD], {"priority": priority})

    def array_jobs(self, array_id: int) -> list[Job]:
        with self.read() as conn:
            rows = conn.execute(
                _job_select().where(jobs.c.array_id == array_id).order_by(jobs.c.id)
            ).all()
        return [_to_job(row) for row in rows]

    def usage_since(self, since: str) -> list[Job]:
        """Jobs that held GPUs at some point after `since`: for fair share."""
        with self.read() as conn:
            rows = conn.execute(
                _job_select().where(
                    jobs.c.started_at.is_not(None),
                    (jobs.c.ended_at.is_(None)) | (jobs.c.ended_at >= since),
                )
            ).all()
        return [_to_job(row) for row in rows]

    def hold(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED], {"state": str(JobState.HELD)})

    def release(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.HELD], {"state": str(JobState.QUEUED)})

    def notify_command(self, job_id: int) -> list[str] | None:
        """The argv `submit --notify` stored for this job, if any."""
        with self.read() as conn:
            value = conn.execute(select(jobs.c.notify).where(jobs.c.id == job_id)).scalar()
        return list(value) if value else None

    # -- measured usage and OOM retries (gpusched.monitor, Scheduler._settle) --------------

    def set_usage(self, job_id: int, **values: Any) -> None:
        """Write some of a job's measured figures (see USAGE_COLUMNS)."""
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**_usage_values(values)))

    def usage_state(self, job_id: int) -> dict[str, Any] | None:
        with self.read() as conn:
            state = conn.execute(
                select(jobs.c.usage_state).where(jobs.c.id == job_id)
            ).scalar_one_or_none()
        return dict(state) if isinstance(state, dict) else None

    def add_retry(self, job_id: int, mem: int | None) -> Job:
        """Queue an OOM retry of an ended or ending job: its row copied with `mem`.

        Idempotent: a job already retried returns its retry. Every column is copied (so
        columns added later, such as an array id or a time limit, carry over) except those
        that describe one run. The retry keeps the original's `submitted_at`, and its
        `retry_of` (the first attempt's id) is its place in the queue.
        """
        with self.engine.begin() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()  # every column
            if row is None:
                raise NotFoundError(f"no job {job_id}")
            if row.retried_as is not None:
                retry = conn.execute(_job_select().where(jobs.c.id == row.retried_as)).one()
                return _to_job(retry)
            values = {
                column.name: getattr(row, column.name)
                for column in jobs.columns
                if column.name not in _PER_RUN_COLUMNS
            }
            values.update(
                state=str(JobState.QUEUED),
                mem=mem,
                gpu_indices=[],
                gpu_uuids=[],
                hints=[],
                retry_oom=max(0, (row.retry_oom or 0) - 1),
                retry_of=row.retry_of or row.id,
            )
            new_id = int(conn.execute(jobs.insert().values(**values)).inserted_primary_key[0])
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(retried_as=new_id))
            retry = conn.execute(_job_select().where(jobs.c.id == new_id)).one()
        return _to_job(retry)

    def latest_attempts(self, job_ids: Iterable[int]) -> dict[int, Job]:
        """Each job by id, or its latest OOM retry in its place."""
        latest = self.get_many(job_ids)
        for _ in range(100):  # retries form short chains; the bound is only a guard
            chase = {i: j.retried_as for i, j in latest.items() if j.retried_as is not None}
            if not chase:
                break
            retries = self.get_many(chase.values())
            for job_id, retry_id in chase.items():
                if retry_id in retries:
                    latest[job_id] = retries[retry_id]
                else:
                    latest[job_id].retried_as = None  # a missing row: stop chasing it
        return latest

    def peaks_for_command(
        self, uid: int, command: Sequence[str], limit: int = 20
    ) -> list[tuple[int, int, int | None]]:
        """(id, peak_mem, declared mem) of the owner's latest successful runs of `command`.

        Only jobs that ended `done` count: a job that failed early never reached its
        working size, and one that ran out of memory shows the card's size, not its need.
        """
        wanted = list(command)
        query = (
            select(jobs.c.id, jobs.c.command, jobs.c.peak_mem, jobs.c.mem)
            .where(
                jobs.c.uid == uid,
                jobs.c.state == str(JobState.DONE),
                jobs.c.peak_mem.is_not(None),
            )
            .order_by(jobs.c.ended_at.desc(), jobs.c.id.desc())
            .limit(5000)  # a bound on the scan; the command is compared here, not in SQL
        )
        with self.read() as conn:
            rows = conn.execute(query).all()
        found = [(row.id, row.peak_mem, row.mem) for row in rows if list(row.command) == wanted]
        return found[:limit]

    def record_usage(self, job_id: int, peak_mem: int | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(peak_mem=peak_mem))
