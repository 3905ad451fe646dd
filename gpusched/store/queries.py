"""The reads of `store.jobs` (`JobReads`, the base of gpusched.store.transitions' `Jobs`):
jobs by id, by state, by array, for fair share, for notifications and for the Prometheus
metrics (counts and queue waits as plain data).

Every read runs on the Database's `read()`, which takes no write lock, so a slow status or
history cannot make a submit wait.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select

from gpusched.core.errors import NotFoundError
from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobState, StopIntent
from gpusched.store import by_id, queue_marks
from gpusched.store.active_page import ActivePage, read_active_page
from gpusched.store.database import Database
from gpusched.store.queued import QUEUED_SELECT, Queued, queued_of
from gpusched.store.rows import JOB_COLUMNS, job_select, to_job
from gpusched.store.schema import jobs

_CHUNK = 200  # ids per read: within SQLite's variable limit, and 200 x 128K of commands


@dataclass(frozen=True)
class LaunchInfo:
    """The parts of a job only the launcher needs (never sent to clients)."""

    gid: int
    env: dict[str, str]
    umask: int
    pid_start_time: str | None
    stop_intent: StopIntent | None = None  # set once the daemon asked it to stop
    env_dropped: bool = False  # an ended job's environment deleted by retention


@dataclass(frozen=True)
class JobFigures:
    """What the Prometheus metrics report of the jobs (store.jobs.job_figures), over the whole
    database: it is the history, so the figures survive a daemon restart."""

    by_state_and_user: dict[tuple[JobState, str], int]  # only the pairs that have jobs
    ended_by_reason: dict[str | None, int]  # ended jobs; None: a row with no reason
    queue_waits_s: list[float]  # submit to start, every job that started (id order)


class JobReads:
    """The reads of `store.jobs` (gpusched.store.transitions.Jobs adds its writes)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # The last queued() read's rows and their `Queued` (queued_of): one memo per store.
        self._queued_known: dict[tuple[Any, ...], Queued] = {}
        # The queue's change marker at the last queued() read, and what it read then
        # (gpusched.store.queue_marks); None: read in full (no marker, or none yet).
        self._queued_mark: int | None = None
        self._queued_last: tuple[Queued, ...] = ()
        self._marked: bool | None = None  # whether the marker's triggers are there

    def get(self, job_id: int) -> Job:
        with self.db.read() as conn:
            row = conn.execute(by_id.JOB_BY_ID, {"job_id": job_id}).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return to_job(row)

    def get_many(self, job_ids: Iterable[int]) -> dict[int, Job]:
        ids = list(job_ids)
        with self.db.read() as conn:
            rows = conn.execute(by_id.JOBS_BY_IDS, {"job_ids": ids}).all()
        return {row.id: to_job(row) for row in rows}

    def launch_info(self, job_id: int) -> LaunchInfo:
        with self.db.read() as conn:
            row = conn.execute(by_id.LAUNCH_INFO_BY_ID, {"job_id": job_id}).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return _launch_info(row)

    def job_and_launch(self, job_id: int) -> tuple[Job, LaunchInfo]:
        """`get` and `launch_info` in one statement (a job's start, and its end)."""
        with self.db.read() as conn:
            row = conn.execute(by_id.JOB_AND_LAUNCH_BY_ID, {"job_id": job_id}).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return to_job(row[: len(JOB_COLUMNS)]), _launch_info(by_id.launch_parts(row))

    def job_and_stop_intent(self, job_id: int) -> tuple[Job, StopIntent | None]:
        """`get` and `launch_info(...).stop_intent` in one statement (a job's end)."""
        with self.db.read() as conn:
            row = conn.execute(by_id.JOB_AND_STOP_INTENT_BY_ID, {"job_id": job_id}).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        intent = row[len(JOB_COLUMNS)]
        return to_job(row[: len(JOB_COLUMNS)]), StopIntent(intent) if intent else None

    def active(self) -> list[Job]:
        """Queued, held and running jobs, in submit order."""
        states = [str(s) for s in ACTIVE_STATES]
        with self.db.read() as conn:
            rows = conn.execute(
                job_select().where(jobs.c.state.in_(states)).order_by(jobs.c.id)
            ).all()
        return [to_job(row) for row in rows]

    def active_page(
        self,
        after_id: int,
        limit: int,
        states: Collection[JobState] = ACTIVE_STATES,
        user: str | None = None,
        *,
        with_nodes: bool = False,
    ) -> ActivePage:
        """A page of `status`, whatever the queue's length: how many jobs (of `user` only,
        if given) are in each active state, up to `limit` active jobs in `states` (of
        `user`) with ids above `after_id`, in id order, read a chunk at a time as they are
        taken, and `with_nodes` the cluster's nodes (gpusched.store.active_page: all but
        the page's later chunks in one statement)."""
        return read_active_page(self.db, after_id, limit, states, user, with_nodes=with_nodes)

    def iter_jobs(self, job_ids: Sequence[int]) -> Iterator[Job]:
        """The jobs of `job_ids` that exist, in that order, read a chunk at a time: a reply
        over thousands of jobs never holds them all (each may carry a 128K command)."""
        for start in range(0, len(job_ids), _CHUNK):
            chunk = job_ids[start : start + _CHUNK]
            found = self.get_many(chunk)
            yield from (found[i] for i in chunk if i in found)

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

    def states_of(self, job_ids: Iterable[int]) -> dict[int, JobState]:
        """The state of each of these jobs that exists (no other column is read)."""
        ids = list(job_ids)
        states: dict[int, JobState] = {}
        with self.db.read() as conn:
            for start in range(0, len(ids), _CHUNK):
                query = select(jobs.c.id, jobs.c.state).where(
                    jobs.c.id.in_(ids[start : start + _CHUNK])
                )
                states.update((int(i), JobState(s)) for i, s in conn.execute(query).all())
        return states

    def count_active_by_user(self) -> dict[str, dict[str, int]]:
        """user -> active state -> how many of their jobs are in it (counted in SQL)."""
        states = [str(s) for s in ACTIVE_STATES]
        query = (
            select(jobs.c.user, jobs.c.state, func.count())
            .where(jobs.c.state.in_(states))
            .group_by(jobs.c.user, jobs.c.state)
        )
        counts: dict[str, dict[str, int]] = {}
        with self.db.read() as conn:
            for user, state, n in conn.execute(query).all():
                counts.setdefault(str(user), {})[str(state)] = int(n)
        return counts

    def running(self) -> list[Job]:
        with self.db.read() as conn:
            rows = conn.execute(by_id.RUNNING).all()
        return [to_job(row) for row in rows]

    def interactive_active(self) -> list[Job]:
        """Active interactive jobs (`gpusched run`, claim()): each pass checks their clients."""
        with self.db.read() as conn:
            rows = conn.execute(by_id.INTERACTIVE_ACTIVE).all()
        return [to_job(row) for row in rows]

    def queued(self) -> tuple[Queued, ...]:
        """Queued jobs (not held), in submit order, with what a scheduling pass needs: the
        very same tuple while the queue is unchanged (what a pass derives from it may be
        kept by it: scheduling.admission, pass_rules).

        The queue is read again only if its change marker moved since the last read
        (gpusched.store.queue_marks): a pass over a long queue that did not change reads
        one number. The marker is read first, so a write committed during the read moves
        the next one."""
        with self.db.read() as conn:
            if self._marked is None:
                self._marked = queue_marks.triggers_present(conn)
            now, counters = queue_marks.mark(conn) if self._marked else (None, 0)
            if now is not None and now == self._queued_mark:
                return self._queued_last
            rows = conn.execute(QUEUED_SELECT.order_by(jobs.c.id)).all()
        if counters > queue_marks.FOLD_ROWS:
            with self.db.write(durable=False) as conn:  # lost, the next read folds again
                queue_marks.fold(conn)
        found, self._queued_known = queued_of(rows, self._queued_known)
        self._queued_mark, self._queued_last = now, tuple(found)
        return self._queued_last

    def left_queue(self, job_ids: Collection[int]) -> None:
        """Jobs this store just took out of the queue, each by one committed write of its
        row (the cluster's placements): the next queued() need not read the queue again
        for them. It still does if anything else changed the queue since the last read,
        this process's other writes included: the marker then moved by more than one per
        job (each such write moves it by exactly one, gpusched.store.queue_marks)."""
        gone = set(job_ids)
        if self._queued_mark is None or not gone:
            return
        self._queued_last = tuple(job for job in self._queued_last if job.id not in gone)
        self._queued_mark += len(gone)

    def ended(
        self,
        limit: int,
        user: str | None = None,
        states: Collection[JobState] = TERMINAL_STATES,
        since: str | None = None,
    ) -> list[Job]:
        """Ended jobs, most recently ended first.

        `states`: some of the terminal states only; `since`: ended at or after this time
        (an ISO timestamp in UTC, as `ended_at` is stored, so text order is time order).
        """
        return list(self.iter_jobs(self.ended_ids(limit, user, states, since)))

    def ended_ids(
        self,
        limit: int,
        user: str | None = None,
        states: Collection[JobState] = TERMINAL_STATES,
        since: str | None = None,
    ) -> list[int]:
        """The ids of `ended()`, in its order."""
        wanted = [str(s) for s in states if s in TERMINAL_STATES]
        state: ColumnElement[str] = jobs.c.state
        if len(wanted) == len(TERMINAL_STATES):
            # Every kind of end: filtered on the bare column, SQLite picks the state index
            # and sorts every ended row (18 ms at 10,000 ended jobs, on every `status --all`
            # and dashboard poll); on an expression, it walks the ended_at index from the
            # newest end and stops at `limit` (0.1 ms).
            state = state.concat("")
        query = select(jobs.c.id).where(state.in_(wanted))
        if user is not None:
            query = query.where(jobs.c.user == user)
        if since is not None:
            query = query.where(jobs.c.ended_at >= since)
        query = query.order_by(jobs.c.ended_at.desc(), jobs.c.id.desc()).limit(limit)
        with self.db.read() as conn:
            return [int(job_id) for job_id in conn.execute(query).scalars()]

    def count(self) -> int:
        with self.db.read() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())

    def array_ids(self, array_id: int) -> list[int]:
        query = select(jobs.c.id).where(jobs.c.array_id == array_id).order_by(jobs.c.id)
        with self.db.read() as conn:
            return [int(job_id) for job_id in conn.execute(query).scalars()]

    def array_jobs(self, array_id: int) -> list[Job]:
        with self.db.read() as conn:
            rows = conn.execute(
                job_select().where(jobs.c.array_id == array_id).order_by(jobs.c.id)
            ).all()
        return [to_job(row) for row in rows]

    def usage_since(self, since: str) -> list[Job]:
        """Jobs that held GPUs at some point after `since`: for fair share."""
        with self.db.read() as conn:
            rows = conn.execute(
                job_select().where(
                    jobs.c.started_at.is_not(None),
                    (jobs.c.ended_at.is_(None)) | (jobs.c.ended_at >= since),
                )
            ).all()
        return [to_job(row) for row in rows]

    def hooks_due(self) -> list[int]:
        """Ended jobs whose notification hooks have not started, in the order they ended."""
        query = select(jobs.c.id).where(jobs.c.hooks_due == 1).order_by(jobs.c.ended_at, jobs.c.id)
        with self.db.read() as conn:
            return [int(job_id) for job_id in conn.execute(query).scalars()]

    def job_figures(self) -> JobFigures:
        """The job counts and queue waits the metrics report, read in one transaction so
        that one scrape sees one moment of the queue."""
        by_state = select(jobs.c.state, jobs.c.user, func.count()).group_by(
            jobs.c.state, jobs.c.user
        )
        by_reason = (
            select(jobs.c.reason, func.count())
            .where(jobs.c.state.in_([str(s) for s in TERMINAL_STATES]))
            .group_by(jobs.c.reason)
        )
        # Every job that ever started: the database is the history, so the waits are the
        # same after a daemon restart. (Two short strings per job: cheap even for a few
        # hundred thousand jobs.)
        starts = (
            select(jobs.c.submitted_at, jobs.c.started_at)
            .where(jobs.c.started_at.is_not(None))
            .order_by(jobs.c.id)
        )
        with self.db.read() as conn:
            state_rows = conn.execute(by_state).all()
            reason_rows = conn.execute(by_reason).all()
            start_rows = conn.execute(starts).all()
        waits = (_seconds_between(submitted, started) for submitted, started in start_rows)
        return JobFigures(
            by_state_and_user={(JobState(s), str(u)): int(n) for s, u, n in state_rows},
            ended_by_reason={reason: int(n) for reason, n in reason_rows},
            queue_waits_s=[w for w in waits if w is not None],
        )


def _launch_info(row: Sequence[Any]) -> LaunchInfo:
    """A LaunchInfo of the launch columns (store.by_id), in their order."""
    gid, inline_env, shared_env, umask, pid_start_time, stop_intent, env_id = row
    env = shared_env if shared_env is not None else inline_env  # older rows: inline
    intent = StopIntent(stop_intent) if stop_intent else None
    dropped = env_id == 0  # gpusched.store.retention.DROPPED_ENV_ID
    return LaunchInfo(gid, dict(env), umask, pid_start_time, intent, dropped)


def _seconds_between(start: str, end: str) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return None
