"""The store's writes of a job's life: submit, start, end, hold, release, priority.

One transaction each. A state change is a compare-and-set (`_transition`): it applies
only if the job is still in a state it may leave, so of two racing changes the first
wins and the second returns False. How durable each write is: gpusched.store_db's
docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from gpusched.models import ACTIVE_STATES, Job, JobState, StopIntent
from gpusched.store_db import Database, inserted_id, job_select, jobs, to_job
from gpusched.store_usage import usage_values


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


class JobTransitions(Database):
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
            rows = conn.execute(job_select().where(jobs.c.id.in_(ids)).order_by(jobs.c.id)).all()
        return [to_job(row) for row in rows]

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
        return inserted_id(result)

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
        hooks_due: bool = False,
        durable: bool = True,
    ) -> bool:
        """End an active job; False if it had already ended (the first ending wins).

        `usage`: the job's final figures (peak, utilization, hints), written with the end.
        `hooks_due`: it has notification hooks to run; recorded with the end, so that a
        daemon that stops before they start runs them at its next start.
        `durable=False` only for an ending read from the supervisor's exit record, which
        a restart can read again (gpusched.store_db's docstring).
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
        return self._transition(job_id, list(ACTIVE_STATES), values, durable)

    def set_pid(self, job_id: int, pid: int, pid_start_time: str) -> None:
        # Not durable (NORMAL): after a power cut no supervisor is left to find by its pid.
        with self._write(durable=False) as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(pid=pid, pid_start_time=pid_start_time)
            )

    def hooks_started(self, job_id: int) -> None:
        """The job's hooks are starting: a restart must not start them again.

        Not durable (NORMAL): lost in a power cut, the hooks run a second time.
        """
        with self._write(durable=False) as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(hooks_due=None))

    def set_detail(self, job_id: int, detail: str) -> None:
        """Note on an active job what its end will be explained by (e.g. who cancelled it)."""
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(reason_detail=detail))

    def set_stop_intent(self, job_id: int, intent: StopIntent, detail: str) -> None:
        """Before a running job is asked to stop: why (read at its end), and the sentence."""
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(stop_intent=str(intent), reason_detail=detail)
            )

    def set_priority(self, job_id: int, priority: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED, JobState.HELD], {"priority": priority})

    def hold(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.QUEUED], {"state": str(JobState.HELD)})

    def release(self, job_id: int) -> bool:
        return self._transition(job_id, [JobState.HELD], {"state": str(JobState.QUEUED)})
