"""How a `jobs` row becomes a Job, and the small pieces of SQL every part of the store
shares: the Job select (every column but the environment), JSON read as text and decoded
once, the id an INSERT made, and the lock that serialises submits on PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Text, func, select, text, type_coerce
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.sql import Select

from gpusched.core.models import Job, JobState
from gpusched.store.schema import jobs

# The columns a Job shows: the model's fields that are stored (waiting_reason is not;
# it is the scheduler's, computed each pass). Derived, so a field added to both stays in step.
_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job) if f.name in jobs.c)
JOB_COLUMNS = _JOB_FIELDS  # how many columns of a row to_job reads, and which

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


# pg_advisory_xact_lock's key for "adding jobs" (the migrations' upgrade lock is another).
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


# How long a transaction that took the submit lock without being a submit may sit idle
# (its client cut off) before the server ends it: other nodes' submits wait on it, each
# up to the server's lock_timeout (docs/cluster.md section 1: 2 s).
BRIEF_HOLD = "1s"


def lock_submits_briefly(conn: Connection) -> bool:
    """`lock_submits` for a chore that may wait (retention): taken only if free now (a
    chore never queues ahead of submits), and, on PostgreSQL, given up by the server a
    moment after this client falls silent inside the transaction, rather than after the
    database's idle_in_transaction_session_timeout (10 s). False: a submit holds it."""
    if conn.dialect.name != "postgresql":
        return True  # SQLite's BEGIN IMMEDIATE already serialises writers
    for setting in ("idle_in_transaction_session_timeout", "statement_timeout"):
        conn.execute(text(f"SET LOCAL {setting} = '{BRIEF_HOLD}'"))
    return bool(conn.execute(select(func.pg_try_advisory_xact_lock(_SUBMIT_LOCK))).scalar())


def inserted_id(result: CursorResult[Any]) -> int:
    """The id of the job row an INSERT just created."""
    key = result.inserted_primary_key
    if key is None:  # only for a statement that inserted nothing, which ours never are
        raise RuntimeError("the insert returned no primary key")
    return int(key[0])


def to_job(row: Sequence[Any]) -> Job:
    # By position (a row of job_select, or its first columns): a pass converts every queued job.
    values = dict(zip(_JOB_FIELDS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = decode_json(values[name])
    values["state"] = JobState(values["state"])
    for flag in ("interactive", "exclusive", "share"):
        values[flag] = bool(values[flag])  # NULL on older rows
    return Job(**values)
