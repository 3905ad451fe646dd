"""The store's writes of a job's life: submit, start, end, hold, release, priority.

One transaction each. A state change is a compare-and-set (`_transition`): it applies
only if the job is still in a state it may leave, so of two racing changes the first
wins and the second returns False. So are the writes about a running job (its pid, why
it is being stopped): a late one changes nothing once the job has ended. Only the usage
figures and `hooks_started` (which clears a flag) are written by id alone. How durable
each write is: gpusched.store.database's docstring.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, func, select, type_coerce, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.errors import ConflictError
from gpusched.core.models import ACTIVE_STATES, EndReason, Job, JobState, StopIntent
from gpusched.store.database import (
    Database,
    decode_json,
    envs,
    inserted_id,
    job_select,
    jobs,
    lock_submits,
    to_job,
)
from gpusched.store.placements import NodeGuard, guarded_end
from gpusched.store.timeline import TimelineWrite, write_timeline
from gpusched.store.usage import usage_values


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
    allowed_nodes: tuple[str, ...] | None = None  # `submit --node a,b`
    requeue: bool = False  # `submit --requeue`: queued again if its node dies
    # `gpusched run` / claim(): the client process that is the job (peer credentials).
    client_pid: int | None = None
    client_start_time: str | None = None  # pidref.process_start_time of client_pid
    exclusive: bool = False  # `--exclusive`: a card to itself
    share: bool = False  # `--share`: light, whatever it measures (policy rule 3)
    output: str | None = None  # `--output`: the log's path template (gpusched.core.output)
    request_id: str | None = None  # the submit's, unique (the jobs of an array: ".N" added)


_CHUNK = 500  # ids per `IN (...)`: SQLite allows 999 variables before 3.32


def _check_waiting(conn: Connection, new: NewJob, adding: int, max_waiting: int) -> None:
    waiting_states = [str(JobState.QUEUED), str(JobState.HELD)]
    waiting = conn.execute(
        select(func.count()).where(jobs.c.uid == new.uid, jobs.c.state.in_(waiting_states))
    ).scalar_one()
    if waiting + adding > max_waiting:
        raise ConflictError(
            f"user limit: {new.user} has {waiting} waiting jobs and submits {adding}"
            f" (max_queued {max_waiting}); cancel some or wait for them to start"
        )


def _env_id(conn: Connection, env: dict[str, str]) -> int:
    """The `envs` row holding `env`, added if no job had this environment before."""
    text = json.dumps(env, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("ascii")).hexdigest()  # json escapes the rest
    found = conn.execute(select(envs.c.id).where(envs.c.digest == digest)).scalar()
    if found is not None:
        return int(found)
    return inserted_id(conn.execute(envs.insert().values(digest=digest, env=dict(env))))


def _row(
    new: NewJob, now: str, array_id: int | None, array_index: int | None, env_id: int
) -> dict[str, Any]:
    """A new job's row (every row of one insert has the same keys)."""
    return {
        "name": new.name,
        "user": new.user,
        "uid": new.uid,
        "gid": new.gid,
        "state": str(JobState.HELD if new.held else JobState.QUEUED),
        "command": list(new.command),
        "cwd": new.cwd,
        "env": {},  # in `envs`, once
        "env_id": env_id,
        "umask": new.umask,
        "mem": new.mem,
        "gpus": new.gpus,
        "gpu_indices": [],
        "gpu_uuids": [],
        "priority": new.priority,
        "after": list(new.after),
        "submitted_at": now,
        "hints": [],
        "array_id": array_id,
        "array_index": array_index,
        "max_concurrent": new.max_concurrent,
        "retry_oom": new.retry_oom,
        "time_limit_s": new.time_limit_s,
        "notify": list(new.notify) if new.notify else None,
        "allowed_nodes": list(new.allowed_nodes) if new.allowed_nodes else None,
        "requeue": 1 if new.requeue else None,
        "interactive": 1 if new.client_pid is not None else None,
        "pid": new.client_pid,
        "pid_start_time": new.client_start_time,
        "exclusive": 1 if new.exclusive else None,
        "share": 1 if new.share else None,
        "output": new.output,
        "request_id": new.request_id,
    }


def _made_by(conn: Connection, new: NewJob, request_id: str) -> list[Job]:
    """The jobs a submit with this request id already made (in the submit lock, so two
    tries of one submit cannot both insert). Another user's id: refused."""
    first = conn.execute(job_select().where(jobs.c.request_id == request_id)).first()
    if first is None:
        return []
    found = to_job(first)
    if found.user != new.user:
        raise ConflictError("this submit's request id was used by another user's submit")
    if found.array_id is None:
        return [found]
    rows = conn.execute(job_select().where(jobs.c.array_id == found.array_id).order_by(jobs.c.id))
    return [to_job(row) for row in rows.all()]


def request_ids(request_id: str, count: int) -> list[str]:
    """The request id each job of a submit stores: the id itself for the first (a retry
    looks for it), with ".N" for the others of an array (the column is unique)."""
    return [request_id] + [f"{request_id}.{i}" for i in range(1, count)]


class JobTransitions(Database):
    def made_by_request(self, user: str, request_id: str) -> list[Job]:
        """What became of a submit: the jobs `user`'s submit with this id made."""
        with self.read() as conn:
            first = conn.execute(
                select(jobs.c.array_id, jobs.c.id, jobs.c.user).where(
                    jobs.c.request_id == request_id
                )
            ).first()
            if first is None or first.user != user:
                return []
            query = job_select().where(
                jobs.c.id == first.id
                if first.array_id is None
                else jobs.c.array_id == first.array_id
            )
            return [to_job(row) for row in conn.execute(query.order_by(jobs.c.id)).all()]

    def add(self, new: NewJob, now: str) -> Job:
        return self.add_many([new], now, as_array=False)[0]

    def add_many(
        self,
        news: Sequence[NewJob],
        now: str,
        as_array: bool = True,
        max_waiting: int | None = None,
    ) -> list[Job]:
        """Insert jobs in one transaction; as an array, they share a new array id.

        `max_waiting`: refuse (ConflictError) if the owner's waiting jobs would then be
        more. Counted in the same transaction as the insert (BEGIN IMMEDIATE holds the
        write lock from the start), so parallel submits cannot each see room for theirs.
        The jobs of one call have one owner and one environment (stored once).
        """
        with self.engine.begin() as conn:
            lock_submits(conn)
            request_id = news[0].request_id
            if request_id is not None:  # a retried submit: what its first try made
                made = _made_by(conn, news[0], request_id)
                if made:
                    return made
            if max_waiting is not None:
                _check_waiting(conn, news[0], len(news), max_waiting)
            env_id = _env_id(conn, news[0].env)
            array_id = None
            if as_array:
                top = conn.execute(select(func.max(jobs.c.array_id))).scalar()
                array_id = (top or 0) + 1
            rows = [
                _row(new, now, array_id, index if as_array else None, env_id)
                for index, new in enumerate(news)
            ]
            if array_id is None:
                ids = [inserted_id(conn.execute(jobs.insert().values(**row))) for row in rows]
                query = job_select().where(jobs.c.id.in_(ids))
            else:  # one executemany (10,000 single inserts took 20 s); found by array id
                conn.execute(jobs.insert(), rows)
                query = job_select().where(jobs.c.array_id == array_id)
            found = conn.execute(query.order_by(jobs.c.id)).all()
        return [to_job(row) for row in found]

    def cancel_waiting(
        self,
        uid: int,
        array_id: int | None,
        detail: str,
        now: str,
        on_finish: bool,
        *,
        user: str | None = None,
    ) -> list[tuple[int, bool]]:
        """Cancel every waiting (queued or held) job of `uid` (of one array), in one
        transaction: (id, whether its notification hooks are due) for each. With `user`,
        the jobs of that user name instead (a cluster's owner: uids differ by server).

        One statement, where cancelling job by job costs a transaction (and an fsync) each.
        `on_finish`: an administrator's hook runs for every job; else only a job's own.
        """
        where = [
            jobs.c.uid == uid if user is None else jobs.c.user == user,
            jobs.c.state.in_([str(JobState.QUEUED), str(JobState.HELD)]),
        ]
        if array_id is not None:
            where.append(jobs.c.array_id == array_id)
        values = {
            "state": str(JobState.CANCELLED),
            "reason": str(EndReason.CANCELLED),
            "ended_at": now,
            "reason_detail": detail,
            "hooks_due": 1 if on_finish else None,
        }
        with self.engine.begin() as conn:
            # One conditional UPDATE that says which rows it changed (RETURNING): a job
            # started by another daemon between a read and this write is not in the list.
            notify = type_coerce(jobs.c.notify, Text)
            rows = conn.execute(
                update(jobs).where(*where).values(**values).returning(jobs.c.id, notify)
            ).all()
            ended = sorted(
                (int(i), on_finish or decode_json(notify) is not None) for i, notify in rows
            )
            own_hooks = [job_id for job_id, due in ended if due] if not on_finish else []
            for start in range(0, len(own_hooks), _CHUNK):  # within SQLite's variable limit
                chunk = own_hooks[start : start + _CHUNK]
                conn.execute(update(jobs).where(jobs.c.id.in_(chunk)).values(hooks_due=1))
        return ended

    def _transition(
        self,
        job_id: int,
        from_states: Sequence[JobState],
        values: dict[str, Any],
        durable: bool = True,
        condition: ColumnElement[bool] | None = None,
    ) -> bool:
        """Apply `values` only if the job is still in one of `from_states` (compare-and-set)
        and meets `condition` if any."""
        with self._write(durable) as conn:
            return self._transition_in(conn, job_id, from_states, values, condition)

    @staticmethod
    def _transition_in(
        conn: Connection,
        job_id: int,
        from_states: Sequence[JobState],
        values: dict[str, Any],
        condition: ColumnElement[bool] | None = None,
    ) -> bool:
        where = [jobs.c.id == job_id, jobs.c.state.in_([str(s) for s in from_states])]
        if condition is not None:
            where.append(condition)
        result = conn.execute(update(jobs).where(*where).values(**values))
        return result.rowcount == 1

    def mark_running(
        self,
        job_id: int,
        *,
        gpu_indices: Sequence[int],
        gpu_uuids: Sequence[str],
        pid: int | None,
        pid_start_time: str | None,
        log_path: str | None,
        now: str,
        node: str | None = None,
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
                "node": node,
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
                "node": None,
                "node_epoch": None,
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
        timeline: TimelineWrite | None = None,
        hooks_due: bool = False,
        durable: bool = True,
        guard: NodeGuard | None = None,
    ) -> bool:
        """End an active job; False if it had already ended (the first ending wins).

        `guard` (cluster): only as that node at that epoch may (store.placements.guarded_end).

        `usage`: the job's final figures (peak, utilization, hints), written with the end;
        `timeline`: the last points of its time series, too.
        `hooks_due`: it has notification hooks to run; recorded with the end, so that a
        daemon that stops before they start runs them at its next start.
        `durable=False` only for an ending read from the supervisor's exit record, which
        a restart can read again (gpusched.store.database's docstring).
        """
        values: dict[str, Any] = {
            **usage_values(usage or {}),
            "state": str(state),
            "reason": reason,
            "ended_at": now,
            "exit_code": exit_code,
            "reason_detail": detail,
            "hooks_due": 1 if hooks_due else None,
        }
        if log_path is not None:
            values["log_path"] = log_path
        states, condition = list(ACTIVE_STATES), None
        if guard is not None:  # a node's own end: also of a job lost with it (its real end)
            states, condition = [*ACTIVE_STATES, JobState.LOST], guarded_end(guard)
        if timeline is None:
            return self._transition(job_id, states, values, durable, condition)
        with self._write(durable) as conn:
            if not self._transition_in(conn, job_id, states, values, condition):
                return False
            write_timeline(conn, job_id, timeline)
        return True

    def set_pid(self, job_id: int, pid: int, pid_start_time: str) -> bool:
        """The supervisor of a running job; False (nothing written) if it is not running.

        Not durable (NORMAL): after a power cut no supervisor is left to find by its pid.
        """
        return self._transition(
            job_id,
            [JobState.RUNNING],
            {"pid": pid, "pid_start_time": pid_start_time},
            durable=False,
        )

    def hooks_started(self, job_id: int) -> None:
        """The job's hooks are starting: a restart must not start them again.

        Not durable (NORMAL): lost in a power cut, the hooks run a second time.
        """
        with self._write(durable=False) as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(hooks_due=None))

    def set_notify_result(self, job_id: int, result: dict[str, Any]) -> None:
        """Record how the job's `--notify` hook ended (shown to its owner)."""
        with self._write(durable=False) as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(notify_result=result))

    def set_detail(self, job_id: int, detail: str) -> bool:
        """Note on an active job what its end will be explained by (e.g. who cancelled it);
        False if it has ended (an ended job's explanation is never rewritten)."""
        return self._transition(job_id, list(ACTIVE_STATES), {"reason_detail": detail})

    def set_stop_intent(self, job_id: int, intent: StopIntent, detail: str) -> bool:
        """Before a running job is asked to stop: why (read at its end), and the sentence;
        False if it is not running any more."""
        return self._transition(
            job_id, [JobState.RUNNING], {"stop_intent": str(intent), "reason_detail": detail}
        )

    def set_priority(self, job_id: int, priority: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED, JobState.HELD], {"priority": priority})

    def put_first(self, job_id: int) -> bool:
        """`gpusched top`: the waiting job goes before every job not put first, after those
        put first before it (its rank: one past the highest of the active jobs')."""
        with self._write() as conn:
            highest = conn.execute(
                select(func.max(jobs.c.top)).where(
                    jobs.c.state.in_([str(s) for s in ACTIVE_STATES])
                )
            ).scalar()
            rank = 1 if highest is None else int(highest) + 1
            return self._transition_in(
                conn, job_id, [JobState.QUEUED, JobState.HELD], {"top": rank}
            )

    def hold(self, job_id: int) -> bool:
        # A job placed on a node (cluster) and held goes back to the scheduler when released.
        unplaced: dict[str, Any] = {
            "node": None,
            "node_epoch": None,
            "gpu_uuids": [],
            "gpu_indices": [],
        }
        return self._transition(
            job_id, [JobState.QUEUED], {"state": str(JobState.HELD), **unplaced}
        )

    def release(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.HELD], {"state": str(JobState.QUEUED)})
