"""What a submit writes: the new jobs' rows, once, whichever try of the submit it is.

`Jobs.add_many` (transitions.py) runs it in one transaction.
`NewJob` is a submit's spec; its rows are inserted as one array or one by one; the
environment is stored once per distinct environment (`envs`); the owner's cap on waiting
jobs (`max_queued`) is counted in the same transaction; a retried submit (the same
`request_id`) gets back what its first try made (`request_ids`, `made_by`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from gpusched.core.errors import ConflictError
from gpusched.core.models import Job, JobState
from gpusched.store.rows import inserted_id, job_select, lock_submits, to_job
from gpusched.store.schema import envs, jobs


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
    after_when: tuple[str, ...] | None = None  # how each of `after` must end; None: all `ok`
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
    # `--share`: light until what was measured of it or its kind says otherwise (policy
    # rule 3)
    share: bool = False
    output: str | None = None  # `--output`: the log's path template (gpusched.processes.output)
    ram: int | None = None  # `--ram`: host memory, bytes; None: its GPUs' share
    cpus: int | None = None  # `--cpus`: cores; None: its GPUs' share
    request_id: str | None = None  # the submit's, unique (the jobs of an array: ".N" added)


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
        "after_when": list(new.after_when) if new.after_when else None,
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
        "ram": new.ram,
        "cpus": new.cpus,
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


def made_by_request(conn: Connection, user: str, request_id: str) -> list[Job]:
    """What became of a submit: the jobs `user`'s submit with this id made."""
    first = conn.execute(
        select(jobs.c.array_id, jobs.c.id, jobs.c.user).where(jobs.c.request_id == request_id)
    ).first()
    if first is None or first.user != user:
        return []
    query = job_select().where(
        jobs.c.id == first.id if first.array_id is None else jobs.c.array_id == first.array_id
    )
    return [to_job(row) for row in conn.execute(query.order_by(jobs.c.id)).all()]


def insert_jobs(
    conn: Connection,
    news: Sequence[NewJob],
    now: str,
    as_array: bool,
    max_waiting: int | None,
) -> list[Job]:
    """`Jobs.add_many`'s transaction (its docstring), on `conn`."""
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
    return [to_job(row) for row in conn.execute(query.order_by(jobs.c.id)).all()]
