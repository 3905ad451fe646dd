"""`store.placements` (`Placements`): the cluster's writes of a job's life: placed on a
node by the elected scheduler, started by that node's agent, ended lost (or queued again)
when its node is declared down.

Each is one transaction whose condition is checked in the database, row count and all:
a placement holds only if the job is still queued and unplaced AND the scheduler's
election epoch is still current; a start only if the job is still placed on this node
AND the node is at the agent's epoch with an unexpired lease. So of two daemons that
both believe they schedule, the stale one's writes are refused, and a node declared
down cannot start anything more under its old epoch (docs/cluster.md).
`unplaced()` / `back_to_queued()`: the columns a job gives back when it returns to the
scheduler (also used by store.jobs' hold and unmark_running).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, bindparam, select, type_coerce, update
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.models import EndReason, Job, JobState
from gpusched.store.attempts import record_requeued
from gpusched.store.database import Database
from gpusched.store.nodes import (
    NODE_DOWN,
    db_iso,
    db_now,
    election_is_current,
    live_at,
    node_is_live,
    nodes,
)
from gpusched.store.rows import decode_json, job_select, to_job
from gpusched.store.schema import jobs


@dataclass(frozen=True)
class NodeGuard:
    """Who writes: this node's name and the epoch its local process was started under."""

    name: str
    epoch: int


@dataclass(frozen=True)
class NodePlacement:
    job_id: int
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class DownResult:
    """What declaring a node down did to its jobs: (id, hooks due) ended, ids queued."""

    lost: list[tuple[int, bool]]
    requeued: list[int]


def unplaced() -> dict[str, Any]:
    """A job given back to the scheduler: on no node, holding no cards."""
    return {"node": None, "node_epoch": None, "gpu_uuids": [], "gpu_indices": []}


def back_to_queued() -> dict[str, Any]:
    """A `running` row put back in the queue (its run never started, or is requeued):
    unplaced, and no trace of the run (pid, log, start)."""
    return {
        "state": str(JobState.QUEUED),
        **unplaced(),
        "pid": None,
        "pid_start_time": None,
        "log_path": None,
        "started_at": None,
    }


def guarded_end(guard: NodeGuard) -> ColumnElement[bool]:
    """Which active rows a node may end: waiting ones, its own running ones of its epoch,
    and those lost with it (their real end, reported when it comes back)."""
    return (
        jobs.c.state.in_([str(JobState.QUEUED), str(JobState.HELD)])
        | (
            (jobs.c.state == str(JobState.RUNNING))
            & (jobs.c.node == guard.name)
            & (jobs.c.node_epoch == guard.epoch)
        )
        | (
            (jobs.c.state == str(JobState.LOST))
            & (jobs.c.reason == str(EndReason.NODE_LOST))
            & (jobs.c.node == guard.name)
        )
    )


class Placements:
    """`store.placements`: the cluster's writes of a job's life, conditioned on epochs."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def place(
        self, placements: Sequence[NodePlacement], holder: str, election_epoch: int
    ) -> list[int]:
        """Place jobs on nodes in one transaction: the ids placed (none if the election
        moved on; a job that was meanwhile cancelled, held or placed is left out)."""
        placed: list[int] = []
        with self.db.write() as conn:
            if not election_is_current(conn, holder, election_epoch):
                return []
            for p in placements:
                epoch = conn.execute(
                    select(nodes.c.epoch).where(nodes.c.name == p.node, nodes.c.state != NODE_DOWN)
                ).scalar()
                if epoch is None:
                    continue
                done = conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.id == p.job_id,
                        jobs.c.state == str(JobState.QUEUED),
                        jobs.c.node.is_(None),
                    )
                    .values(
                        node=p.node,
                        node_epoch=int(epoch),
                        gpu_uuids=list(p.gpu_uuids),
                        gpu_indices=list(p.gpu_indices),
                        waiting_reason=None,
                    )
                )
                if done.rowcount == 1:
                    placed.append(p.job_id)
        return placed

    def placed(self, node: str | None = None) -> list[Job]:
        """Jobs placed and not started yet (on `node`, or on any)."""
        query = job_select().where(jobs.c.state == str(JobState.QUEUED), jobs.c.node.is_not(None))
        if node is not None:
            query = query.where(jobs.c.node == node)
        with self.db.read() as conn:
            return [to_job(row) for row in conn.execute(query.order_by(jobs.c.id)).all()]

    def claims(self) -> list[Job]:
        """Jobs running or placed on a node, read in ONE statement: read apart, a job that
        starts between the two reads is in neither, and its GPU looks free."""
        query = job_select().where(
            jobs.c.node.is_not(None),
            jobs.c.state.in_([str(JobState.RUNNING), str(JobState.QUEUED)]),
        )
        with self.db.read() as conn:
            return [to_job(row) for row in conn.execute(query.order_by(jobs.c.id)).all()]

    def placed_ids(self, node: str) -> list[int]:
        """The ids of the jobs placed on `node` and not started yet."""
        query = select(jobs.c.id).where(jobs.c.node == node, jobs.c.state == str(JobState.QUEUED))
        with self.db.read() as conn:
            return [int(i) for i in conn.execute(query).scalars()]

    def unplace(self, job_id: int, node: str) -> bool:
        """Back to the scheduler: a placed job its node will not start (e.g. no such user)."""
        with self.db.write() as conn:
            done = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state == str(JobState.QUEUED),
                    jobs.c.node == node,
                )
                .values(**unplaced())
            )
        return done.rowcount == 1

    def mark_running_placed(
        self,
        job_id: int,
        guard: NodeGuard,
        log_path: str | None,
        pid: tuple[int, str | None] | None = None,
    ) -> bool:
        """The claim that a placed job starts here (before its process exists, as
        store.jobs.mark_running): refused unless this node is live at the guard's epoch.
        `pid`: an interactive job's client (pid, start time), the job's process already.
        `started_at` is the database's time of the claim until `launched` says when the
        process was started."""
        with self.db.write() as conn:
            now = live_at(conn, guard.name, guard.epoch, self.db.lease_clock)
            if now is None:
                return False
            done = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state == str(JobState.QUEUED),
                    jobs.c.node == guard.name,
                )
                .values(
                    state=str(JobState.RUNNING),
                    node_epoch=guard.epoch,
                    pid=None if pid is None else pid[0],
                    pid_start_time=None if pid is None else pid[1],
                    log_path=log_path,
                    started_at=now,
                )
            )
        return done.rowcount == 1

    def launched(self, job_id: int, guard: NodeGuard, pid: int, pid_start_time: str) -> bool:
        """A claimed job's supervisor was started: its pid, and `started_at` the launch's
        time by the database's clock. False: the row is no longer this node's running one."""
        with self.db.write(durable=False) as conn:  # as store.jobs.set_pid: no supervisor survives
            done = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state == str(JobState.RUNNING),
                    jobs.c.node == guard.name,
                    jobs.c.node_epoch == guard.epoch,
                )
                .values(
                    pid=pid,
                    pid_start_time=pid_start_time,
                    started_at=db_iso(conn, self.db.lease_clock),
                )
            )
        return done.rowcount == 1

    def unclaim(self, job_id: int, guard: NodeGuard) -> bool:
        """Back to the scheduler: a job this node claimed but will not launch (its launch
        deadline passed while the claim committed). Only this node's claim at its epoch."""
        with self.db.write() as conn:
            done = conn.execute(
                update(jobs)
                .where(
                    jobs.c.id == job_id,
                    jobs.c.state == str(JobState.RUNNING),
                    jobs.c.node == guard.name,
                    jobs.c.node_epoch == guard.epoch,
                    jobs.c.pid.is_(None),
                )
                .values(**back_to_queued())
            )
        return done.rowcount == 1

    def declare_down(
        self,
        name: str,
        seen_epoch: int,
        *,
        holder: str,
        election_epoch: int,
        grace_s: float,
        why: str,
    ) -> DownResult | None:
        """Mark a node whose lease ran out more than `grace_s` ago (by the database's
        clock) `down` and bump its epoch, then end its running jobs `lost` (reason
        node_lost) or queue them again (`--requeue`), and give its placed jobs back to the
        scheduler: one transaction. None: refused (the node renewed meanwhile, or this
        daemon no longer schedules)."""
        with self.db.write() as conn:
            if not election_is_current(conn, holder, election_epoch):
                return None
            now = db_iso(conn, self.db.lease_clock)
            done = conn.execute(
                update(nodes)
                .where(
                    nodes.c.name == name,
                    nodes.c.epoch == seen_epoch,
                    nodes.c.state != NODE_DOWN,
                    nodes.c.lease_expires + grace_s < db_now(conn, self.db.lease_clock),
                )
                .values(state=NODE_DOWN, epoch=seen_epoch + 1)
            )
            if done.rowcount != 1:
                return None
            running = (jobs.c.node == name) & (jobs.c.state == str(JobState.RUNNING))
            rows = conn.execute(
                select(
                    jobs.c.id,
                    jobs.c.requeue,
                    type_coerce(jobs.c.notify, Text),
                    jobs.c.started_at,
                    jobs.c.gpu_uuids,
                    jobs.c.gpu_indices,
                ).where(running)
            ).all()
            requeued = [int(r[0]) for r in rows if r[1]]
            lost = [(int(r[0]), decode_json(r[2]) is not None) for r in rows if not r[1]]
            for r in rows:
                if r[1]:  # the run it ends stays visible (store.attempts)
                    cards = (list(r[4] or []), list(r[5] or []))
                    record_requeued(
                        conn, int(r[0]), node=name, started_at=r[3], cards=cards, now=now, why=why
                    )
            if requeued:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(requeued), running)
                    .values(**back_to_queued(), stop_intent=None)
                )
            for job_id, hooks in lost:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id, running)
                    .values(
                        state=str(JobState.LOST),
                        reason=str(EndReason.NODE_LOST),
                        reason_detail=why,
                        ended_at=now,
                        hooks_due=1 if hooks else None,
                    )
                )
            conn.execute(
                update(jobs)
                .where(jobs.c.node == name, jobs.c.state == str(JobState.QUEUED))
                .values(**unplaced())
            )
        return DownResult(lost, requeued)

    def revive_lost(self, name: str, epoch: int, job_ids: Sequence[int]) -> list[int]:
        """Jobs ended `lost` with node `name` whose processes still run there, `running`
        again under its current `epoch` (their end is then recorded as any running job's):
        the ids revived."""
        lost_here = (
            jobs.c.id.in_(list(job_ids)),
            jobs.c.state == str(JobState.LOST),
            jobs.c.reason == str(EndReason.NODE_LOST),
            jobs.c.node == name,
        )
        with self.db.write() as conn:
            if not node_is_live(conn, name, epoch, self.db.lease_clock):
                return []
            ids = [int(i) for i in conn.execute(select(jobs.c.id).where(*lost_here)).scalars()]
            if ids:
                conn.execute(
                    update(jobs)
                    .where(*lost_here)
                    .values(
                        state=str(JobState.RUNNING),
                        node_epoch=epoch,
                        reason=None,
                        reason_detail=None,
                        ended_at=None,
                        hooks_due=None,
                    )
                )
        return ids

    def rows_of(self, job_ids: Sequence[int]) -> dict[int, tuple[JobState, str | None, int | None]]:
        """(state, node, node epoch) of each of these jobs: what an agent back from a
        partition compares with what it runs."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.state, jobs.c.node, jobs.c.node_epoch).where(
                    jobs.c.id.in_(list(job_ids))
                )
            ).all()
        return {int(i): (JobState(s), n, e) for i, s, n, e in rows}

    def stop_requested(self, node: str) -> list[int]:
        """Running jobs on `node` that a daemon asked to stop (a cancel, from any node)."""
        with self.db.read() as conn:
            return [
                int(i)
                for i in conn.execute(
                    select(jobs.c.id).where(
                        jobs.c.state == str(JobState.RUNNING),
                        jobs.c.node == node,
                        jobs.c.stop_intent.is_not(None),
                    )
                ).scalars()
            ]

    def set_waiting_reasons(self, reasons: dict[int, str | None]) -> None:
        """Record why queued jobs wait (only those whose reason changed are passed)."""
        if not reasons:
            return
        rows = [{"job_id": i, "why": why} for i, why in reasons.items()]
        with self.db.write(durable=False) as conn:  # lost in a power cut: said again next pass
            conn.execute(
                update(jobs)
                .where(jobs.c.id == bindparam("job_id"), jobs.c.state == str(JobState.QUEUED))
                .values(waiting_reason=bindparam("why")),
                rows,
            )
