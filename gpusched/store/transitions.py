"""`store.jobs` (`Jobs`): the writes of a job's life here (submit, start, end, hold,
release, priority), its reads inherited from gpusched.store.queries' `JobReads` (one base,
not another part: together they are the one part that owns the `jobs` rows).

One transaction each. A state change is a compare-and-set (`_transition`): it applies
only if the job is still in a state it may leave, so of two racing changes the first
wins and the second returns False. So are the writes about a running job (its pid, why
it is being stopped): a late one changes nothing once the job has ended. Only the usage
figures and `hooks_started` (which clears a flag) are written by id alone. How durable
each write is: gpusched.store.database's docstring.
What a submit inserts (its rows, a retry's earlier jobs) is gpusched.store.submits's;
`add_many` runs it in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, func, select, type_coerce, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from gpusched.core.models import ACTIVE_STATES, EndReason, Job, JobState, StopIntent
from gpusched.store import by_id
from gpusched.store.placements import NodeGuard, back_to_queued, guarded_end, unplaced
from gpusched.store.queries import JobReads
from gpusched.store.rows import decode_json
from gpusched.store.schema import jobs
from gpusched.store.submits import NewJob, insert_jobs, made_by_request
from gpusched.store.timeline import TimelineWrite, write_timeline
from gpusched.store.usage import usage_values

_CHUNK = 500  # ids per `IN (...)`: SQLite allows 999 variables before 3.32


class _EndedAlready(Exception):
    """A later ending of a job already ended: its transaction is rolled back."""


class Jobs(JobReads):
    """`store.jobs`: a job's submit and state changes (here), and its reads (JobReads)."""

    def made_by_request(self, user: str, request_id: str) -> list[Job]:
        """What became of a submit: the jobs `user`'s submit with this id made."""
        with self.db.read() as conn:
            return made_by_request(conn, user, request_id)

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
        with self.db.write() as conn:
            return insert_jobs(conn, news, now, as_array, max_waiting)

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
        with self.db.write() as conn:
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
        with self.db.write(durable) as conn:
            return self._transition_in(conn, job_id, from_states, values, condition)

    @staticmethod
    def _transition_in(
        conn: Connection,
        job_id: int,
        from_states: Sequence[JobState],
        values: dict[str, Any],
        condition: ColumnElement[bool] | None = None,
    ) -> bool:
        states = tuple(str(s) for s in from_states)
        if condition is None and not any(isinstance(v, ClauseElement) for v in values.values()):
            # The statement built once (store.by_id), the values passed beside it.
            params = {**values, by_id.TRANSITION_ID: job_id}
            return conn.execute(by_id.transition(states), params).rowcount == 1
        where = [jobs.c.id == job_id, jobs.c.state.in_(states)]
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
            back_to_queued(),
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
        try:
            with self.db.write(durable) as conn:
                # The series before the job's row: a batch cut between its Execute and its
                # Sync (a partition) leaves its backend holding what it locked until its
                # peer is gone, whatever the server's timeouts; a job row locked by then
                # would stall every node's pass on it (tests/test_end_lock_order.py).
                write_timeline(conn, job_id, timeline)
                if not self._transition_in(conn, job_id, states, values, condition):
                    raise _EndedAlready  # the first ending wins: its points go with it
        except _EndedAlready:
            return False
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
        with self.db.write(durable=False) as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(hooks_due=None))

    def set_notify_result(self, job_id: int, result: dict[str, Any]) -> None:
        """Record how the job's `--notify` hook ended (shown to its owner)."""
        with self.db.write(durable=False) as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(notify_result=result))

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
        with self.db.write() as conn:
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
        return self._transition(
            job_id, [JobState.QUEUED], {"state": str(JobState.HELD), **unplaced()}
        )

    def release(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.HELD], {"state": str(JobState.QUEUED)})

    def change_many(self, job_ids: Sequence[int], action: str, priority: int = 0) -> set[int]:
        """`hold`, `release` or `priority` (set to `priority`) each job as its one-job
        method would, all in one transaction: the ids of those changed."""
        changes: dict[str, tuple[list[JobState], dict[str, Any]]] = {
            "hold": ([JobState.QUEUED], {"state": str(JobState.HELD), **unplaced()}),
            "release": ([JobState.HELD], {"state": str(JobState.QUEUED)}),
            "priority": ([JobState.QUEUED, JobState.HELD], {"priority": priority}),
        }
        from_states, values = changes[action]
        with self.db.write() as conn:
            return {i for i in job_ids if self._transition_in(conn, i, from_states, values)}
