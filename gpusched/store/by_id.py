"""The statements a job's end and the next job's start run once per job, built once.

A statement built at each call (`select(...).where(jobs.c.id == job_id)`) spends about
half of its time being built and hashed for SQLAlchemy's compiled cache (0.15 of 0.3 ms
for a job's row on SQLite); one built once with bind parameters memoizes its cache key,
so each run costs the database's work and the row's conversion alone (the daemon's CPU
between one job's end and the next one's start is what matters). Same SQL, same results.

`JOB_AND_LAUNCH_BY_ID` reads a job's row and its launch parts (store.queries.LaunchInfo)
in one statement, for a job's start; `JOB_AND_STOP_INTENT_BY_ID` its row and why it was
stopped, for its end.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.sql import Select, Update

from gpusched.core.models import ACTIVE_STATES, JobState
from gpusched.store.rows import JOB_COLUMNS, job_select
from gpusched.store.schema import envs, jobs

JOB_BY_ID: Select[Any] = job_select().where(jobs.c.id == bindparam("job_id"))
JOBS_BY_IDS: Select[Any] = job_select().where(jobs.c.id.in_(bindparam("job_ids", expanding=True)))

RUNNING: Select[Any] = job_select().where(jobs.c.state == str(JobState.RUNNING)).order_by(jobs.c.id)
INTERACTIVE_ACTIVE: Select[Any] = (
    job_select()
    .where(jobs.c.interactive == 1, jobs.c.state.in_([str(s) for s in ACTIVE_STATES]))
    .order_by(jobs.c.id)
)

# What only the launcher needs of a job (store.queries.LaunchInfo), in this order.
_LAUNCH_COLUMNS = (
    jobs.c.gid.label("launch_gid"),
    jobs.c.env.label("launch_env"),
    envs.c.env.label("launch_shared_env"),
    jobs.c.umask.label("launch_umask"),
    jobs.c.pid_start_time.label("launch_pid_start_time"),
    jobs.c.stop_intent.label("launch_stop_intent"),
    jobs.c.env_id.label("launch_env_id"),
)
_WITH_ENV = jobs.outerjoin(envs, jobs.c.env_id == envs.c.id)

LAUNCH_INFO_BY_ID: Select[Any] = (
    select(*_LAUNCH_COLUMNS).select_from(_WITH_ENV).where(jobs.c.id == bindparam("job_id"))
)
# A Job's columns first (rows.to_job reads them by position), then the launch parts.
JOB_AND_LAUNCH_BY_ID: Select[Any] = (
    job_select()
    .add_columns(*_LAUNCH_COLUMNS)
    .select_from(_WITH_ENV)
    .where(jobs.c.id == bindparam("job_id"))
)

# A Job's columns, then why the daemon asked it to stop (a job's end is settled on both).
JOB_AND_STOP_INTENT_BY_ID: Select[Any] = (
    job_select()
    .add_columns(jobs.c.stop_intent.label("launch_stop_intent"))
    .where(jobs.c.id == bindparam("job_id"))
)

# The bind parameter of `transition`'s job id: no column of `jobs` is called so, so the
# values it sets can be passed beside it.
TRANSITION_ID = "transition_job_id"


@functools.cache
def transition(from_states: tuple[str, ...]) -> Update:
    """A compare-and-set on one job from one of `from_states` (store.transitions), one
    statement for each such tuple (a handful): the values it sets are given at execution,
    the SET clause made of their names (one compiled form per set of names)."""
    # Equalities, not IN: an IN list is expanded into the SQL at every execution.
    in_state = or_(*(jobs.c.state == state for state in from_states))
    return update(jobs).where(jobs.c.id == bindparam(TRANSITION_ID), in_state)


def launch_parts(row: Sequence[Any]) -> tuple[Any, ...]:
    """The launch parts of a row of JOB_AND_LAUNCH_BY_ID (those after a Job's columns)."""
    return tuple(row[len(JOB_COLUMNS) :])
