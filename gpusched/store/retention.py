"""Retention in the database: what ended jobs leave is deleted once it is old enough.

`prune(db, settings, now)` applies the `retention:` config (gpusched.config.retention)
to the database and returns what it did (`Pruned`), including the log files of the jobs
it deleted or whose logs expired, for the caller to unlink (the daemon's retention pass,
gpusched.daemon.retention; `gpusched admin prune`). It touches only ended jobs:

- `history`: an ended job's row goes (its timeline with it, ON DELETE CASCADE); never
  one whose notification hooks are still due, nor one an active job waits for (`--after`:
  that dependency must stay to be judged).
- `timelines`: an ended job's series goes.
- `environments`: an ended job's environment is dropped (env {} and env_id 0, which
  `requeue` reads as "deleted": `LaunchInfo.env_dropped`), then every stored environment no
  job refers to. Submit-then-cancel with a new 240 KB environment each time grew the
  database by 578 MB a minute, since a cancelled job kept its environment for good.
- `logs`: an ended job's `log_path` is returned to unlink and cleared.
- the log share (`logs_in`, `forget_log`): each job's log in log_dir, for
  gpusched.daemon.log_share to sum per user, and an ended one's log cleared with why.

Each step deletes at most BATCH rows per transaction, so submits go on between them.
With `dry_run` nothing changes: each step counts what it would delete (and lists the
logs), except `stored_environments`, which only a real drop of environments frees.
`gpusched admin prune --ended-before AGE` is this with `history` alone set to AGE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlalchemy import ColumnElement, Connection, Select, and_, delete, exists, func, select, update

from gpusched.config.retention import RetentionSettings
from gpusched.core.clock import iso
from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES
from gpusched.store.database import Database
from gpusched.store.rows import lock_submits_briefly
from gpusched.store.schema import envs, jobs, timeline_points

BATCH = 2000
# env_id of an ended job whose environment retention dropped (ids start at 1).
DROPPED_ENV_ID = 0


@dataclass
class Pruned:
    """What one pass deleted: rows and series counted, logs to unlink by the caller."""

    jobs: int = 0
    timelines: int = 0
    environments: int = 0  # ended jobs whose environment was dropped
    stored_environments: int = 0  # `envs` rows no job used any more
    logs: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.jobs or self.timelines or self.environments or self.stored_environments
        ) or bool(self.logs)


def _cutoff(now: float, keep_s: float) -> str:
    return iso(datetime.fromtimestamp(now - keep_s, timezone.utc))


def _ended_before(cutoff: str) -> ColumnElement[bool]:
    return and_(
        jobs.c.state.in_([str(s) for s in TERMINAL_STATES]),
        jobs.c.ended_at.is_not(None),
        jobs.c.ended_at < cutoff,
    )


def prune(
    db: Database, settings: RetentionSettings, now: float, *, dry_run: bool = False
) -> Pruned:
    """Apply `settings` to the database as of `now` (epoch seconds); with `dry_run`, only
    count what would go (module docstring)."""
    done = Pruned()
    if dry_run:
        _count(db, settings, now, done)
        return done
    if settings.logs_s is not None:
        _expire_logs(db, _cutoff(now, settings.logs_s), done)
    if settings.history_s is not None:
        _delete_jobs(db, _cutoff(now, settings.history_s), done)
    if settings.timelines_s is not None:
        _delete_timelines(db, _cutoff(now, settings.timelines_s), done)
    if settings.environments_s is not None:
        _drop_environments(db, _cutoff(now, settings.environments_s), done)
    elif done.jobs:
        _delete_unused_environments(db, done)  # those only the deleted jobs used
    return done


def _count(db: Database, settings: RetentionSettings, now: float, done: Pruned) -> None:
    """What `prune` would do, changing nothing (the same conditions as each step's)."""
    with db.read() as conn:
        logs: list[str] = []
        if settings.logs_s is not None:
            ended = _ended_before(_cutoff(now, settings.logs_s))
            query = select(jobs.c.log_path).where(ended, jobs.c.log_path.is_not(None))
            logs.extend(str(path) for path in conn.execute(query).scalars())
        if settings.history_s is not None:
            ended = _deletable(_cutoff(now, settings.history_s), _waited_for(conn))
            rows = conn.execute(select(jobs.c.id, jobs.c.log_path).where(ended)).all()
            done.jobs = len(rows)
            logs.extend(str(r.log_path) for r in rows if r.log_path)
        if settings.timelines_s is not None:
            ended = _ended_before(_cutoff(now, settings.timelines_s))
            with_points = exists().where(timeline_points.c.job_id == jobs.c.id)
            query = select(func.count()).select_from(jobs).where(ended, with_points)
            done.timelines = int(conn.execute(query).scalar_one())
        if settings.environments_s is not None:
            ended = _ended_before(_cutoff(now, settings.environments_s))
            query = select(func.count()).select_from(jobs).where(ended, _holding_env())
            done.environments = int(conn.execute(query).scalar_one())
        done.logs = list(dict.fromkeys(logs))  # a job's log counted once


def _waited_for(conn: Connection) -> list[int]:
    """The ids of the jobs an active job waits for (`--after`)."""
    active = [str(s) for s in ACTIVE_STATES]
    afters = conn.execute(select(jobs.c.after).where(jobs.c.state.in_(active))).scalars()
    return sorted({int(job_id) for after in afters for job_id in (after or [])})


def _deletable(cutoff: str, waited_for: list[int]) -> ColumnElement[bool]:
    """An ended job whose row `history` may delete: no hook due, no active job waiting."""
    condition = and_(_ended_before(cutoff), func.coalesce(jobs.c.hooks_due, 0) == 0)
    return and_(condition, jobs.c.id.not_in(waited_for)) if waited_for else condition


def _holding_env() -> ColumnElement[bool]:
    return (jobs.c.env_id.is_(None)) | (jobs.c.env_id != DROPPED_ENV_ID)


def _expire_logs(db: Database, cutoff: str, done: Pruned) -> None:
    while True:
        with db.write() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.log_path)
                .where(_ended_before(cutoff), jobs.c.log_path.is_not(None))
                .limit(BATCH)
            ).all()
            if not rows:
                return
            conn.execute(
                update(jobs).where(jobs.c.id.in_([r.id for r in rows])).values(log_path=None)
            )
        done.logs.extend(str(r.log_path) for r in rows)


def _delete_jobs(db: Database, cutoff: str, done: Pruned) -> None:
    while True:
        with db.write() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.log_path)
                .where(_deletable(cutoff, _waited_for(conn)))
                .limit(BATCH)
            ).all()
            if not rows:
                return
            ids = [r.id for r in rows]
            # Explicitly too: SQLite cascades only with foreign_keys on, set per connection.
            conn.execute(delete(timeline_points).where(timeline_points.c.job_id.in_(ids)))
            conn.execute(delete(jobs).where(jobs.c.id.in_(ids)))
        done.jobs += len(ids)
        done.logs.extend(str(r.log_path) for r in rows if r.log_path)


def _delete_timelines(db: Database, cutoff: str, done: Pruned) -> None:
    while True:
        with db.write() as conn:
            ids = list(
                conn.execute(
                    select(jobs.c.id)
                    .where(
                        _ended_before(cutoff),
                        exists().where(timeline_points.c.job_id == jobs.c.id),
                    )
                    .limit(BATCH)
                ).scalars()
            )
            if not ids:
                return
            conn.execute(delete(timeline_points).where(timeline_points.c.job_id.in_(ids)))
        done.timelines += len(ids)


def _drop_environments(db: Database, cutoff: str, done: Pruned) -> None:
    holding = _holding_env()
    while True:
        with db.write() as conn:
            ids = list(
                conn.execute(select(jobs.c.id).where(_ended_before(cutoff), holding).limit(BATCH))
                .scalars()
                .all()
            )
            if not ids:
                break
            conn.execute(
                update(jobs).where(jobs.c.id.in_(ids)).values(env={}, env_id=DROPPED_ENV_ID)
            )
        done.environments += len(ids)
    _delete_unused_environments(db, done)


def _delete_unused_environments(db: Database, done: Pruned) -> None:
    """The stored environments no job uses, found without the submit lock, then deleted
    under it if still unused: a submit finds an existing environment, then adds jobs that
    use it, in one transaction, and on PostgreSQL this delete must not run between the
    two. The lock is held only for the delete of those found, briefly
    (rows.lock_submits_briefly): a node cut off while holding it holds up every other
    node's submits. A pass that finds none takes no lock; one that finds the lock taken
    leaves the rest to the next pass."""
    while True:
        with db.read() as conn:
            unused = list(
                conn.execute(select(envs.c.id).where(envs.c.id.not_in(_used_envs())).limit(BATCH))
                .scalars()
                .all()
            )
        if not unused:
            return
        with db.write() as conn:
            if not lock_submits_briefly(conn):
                return
            still = envs.c.id.in_(unused) & envs.c.id.not_in(_used_envs(unused))
            result = conn.execute(delete(envs).where(still))
        done.stored_environments += max(0, result.rowcount or 0)
        if len(unused) < BATCH:
            return


def _used_envs(among: list[int] | None = None) -> Select[tuple[int | None]]:
    used = jobs.c.env_id.is_not(None) if among is None else jobs.c.env_id.in_(among)
    return select(jobs.c.env_id).where(used).distinct()


def checkpoint(db: Database) -> None:
    """Make every commit so far durable before files that could replay it are deleted.

    Ends read from a supervisor's exit record are committed without a sync (Store); the
    exit record is the copy that survives a power cut until the next sync. On SQLite a
    checkpoint syncs the write-ahead log; PostgreSQL's WAL writer flushes asynchronous
    commits within three wal_writer_delay (600 ms by default), which the caller's wait
    (only jobs ended some seconds ago) covers.
    """
    if db.engine.dialect.name != "sqlite":
        return
    with db.engine.connect() as conn:
        # On the driver's connection, outside any transaction: SQLAlchemy would begin one
        # (BEGIN IMMEDIATE here), inside which SQLite refuses a checkpoint ("database
        # table is locked"), so every pass failed before removing a directory.
        raw = conn.connection.driver_connection
        assert raw is not None  # noqa: S101 - a checked-out connection always has one
        raw.execute("PRAGMA wal_checkpoint(PASSIVE)")


@dataclass(frozen=True)
class KeptLog:
    """A job's log in log_dir, as the log share reads it (gpusched.daemon.log_share)."""

    job_id: int
    user: str
    running: bool
    ended_at: str | None
    path: str


def logs_in(db: Database, log_dir: str) -> list[KeptLog]:
    """Every job's log that is in `log_dir` (not a user's `--output` path), oldest end
    first, then the running ones."""
    query = select(jobs.c.id, jobs.c.user, jobs.c.state, jobs.c.ended_at, jobs.c.log_path).where(
        jobs.c.log_path.is_not(None), jobs.c.output.is_(None)
    )
    prefix = log_dir.rstrip("/") + "/"
    terminal = {str(s) for s in TERMINAL_STATES}
    with db.read() as conn:
        rows = conn.execute(query).all()
    found = [
        KeptLog(r.id, r.user, r.state not in terminal, r.ended_at, str(r.log_path))
        for r in rows
        if str(r.log_path).startswith(prefix)
    ]
    found.sort(key=lambda kept: (kept.running, kept.ended_at or "", kept.job_id))
    return found


def forget_log(db: Database, job_id: int, path: str, why: str) -> bool:
    """Clear an ended job's `log_path` (still `path`), saying `why` in `log_removed`;
    whether it was cleared (False: the job changed meanwhile, e.g. requeued)."""
    with db.write() as conn:
        result = conn.execute(
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.log_path == path,
                jobs.c.state.in_([str(s) for s in TERMINAL_STATES]),
            )
            .values(log_path=None, log_removed=why)
        )
    return bool(result.rowcount)
