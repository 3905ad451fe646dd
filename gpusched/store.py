"""The job store: SQLAlchemy Core over SQLite (WAL) by default; the daemon is its only user.

The database is the truth about jobs. Every state change is one short transaction
that starts with BEGIN IMMEDIATE, so concurrent writers queue on SQLite's lock (with
a busy timeout) instead of failing with "database is locked" half way through, and
a submit is acknowledged only once its row is committed (synchronous=FULL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import Connection, Row

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
)

_JOB_FIELDS = (
    "id",
    "name",
    "user",
    "uid",
    "state",
    "command",
    "cwd",
    "mem",
    "gpus",
    "gpu_indices",
    "gpu_uuids",
    "priority",
    "after",
    "submitted_at",
    "started_at",
    "ended_at",
    "pid",
    "exit_code",
    "reason",
    "reason_detail",
    "log_path",
    "peak_mem",
    "mean_util",
    "hints",
)


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


@dataclass(frozen=True)
class LaunchInfo:
    """The parts of a job only the launcher needs (never sent to clients)."""

    gid: int
    env: dict[str, str]
    umask: int
    pid_start_time: str | None


def _to_job(row: Row[Any]) -> Job:
    values = {name: getattr(row, name) for name in _JOB_FIELDS}
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
        connection.exec_driver_sql("BEGIN IMMEDIATE")


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

    def close(self) -> None:
        self.engine.dispose()

    # -- reads -------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return _to_job(row)

    def get_many(self, job_ids: Iterable[int]) -> dict[int, Job]:
        ids = list(job_ids)
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs).where(jobs.c.id.in_(ids))).all()
        return {row.id: _to_job(row) for row in rows}

    def launch_info(self, job_id: int) -> LaunchInfo:
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(jobs).where(jobs.c.state.in_(states)).order_by(jobs.c.id)
            ).all()
        return [_to_job(row) for row in rows]

    def ended(self, limit: int, user: str | None = None) -> list[Job]:
        """Ended jobs, most recently ended first."""
        query = select(jobs).where(jobs.c.state.in_([str(s) for s in TERMINAL_STATES]))
        if user is not None:
            query = query.where(jobs.c.user == user)
        query = query.order_by(jobs.c.ended_at.desc(), jobs.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [_to_job(row) for row in conn.execute(query).all()]

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())

    # -- writes: one transaction each ---------------------------------------------------

    def add(self, new: NewJob, now: str) -> Job:
        with self.engine.begin() as conn:
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
                )
            )
            job_id = int(result.inserted_primary_key[0])
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        return _to_job(row)

    def _transition(
        self, job_id: int, from_states: Sequence[JobState], values: dict[str, Any]
    ) -> bool:
        """Apply `values` only if the job is still in one of `from_states` (compare-and-set)."""
        with self.engine.begin() as conn:
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
    ) -> bool:
        """End an active job; False if it had already ended (the first ending wins)."""
        values: dict[str, Any] = {
            "state": str(state),
            "reason": reason,
            "ended_at": now,
            "exit_code": exit_code,
            "reason_detail": detail,
        }
        if log_path is not None:
            values["log_path"] = log_path
        return self._transition(job_id, list(ACTIVE_STATES), values)

    def set_pid(self, job_id: int, pid: int, pid_start_time: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(pid=pid, pid_start_time=pid_start_time)
            )

    def set_detail(self, job_id: int, detail: str) -> None:
        """Note on an active job what its end will be explained by (e.g. who cancelled it)."""
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(reason_detail=detail))

    def hold(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED], {"state": str(JobState.HELD)})

    def release(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.HELD], {"state": str(JobState.QUEUED)})

    def record_usage(self, job_id: int, peak_mem: int | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(peak_mem=peak_mem))
