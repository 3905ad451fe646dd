"""What one page of `status` reads of the jobs: the page's active jobs, in id order, and
how many jobs are in each active state, the first chunk of the page and the counts in
one statement.

On PostgreSQL every statement is a round trip to another process; on SQLite it is a read
of a file in the daemon's own. A page used to be read in three (the page's ids, their
rows, the counts) plus its transaction's BEGIN and ROLLBACK; now the page's first chunk
(its rows straight away, no ids first) and the counts are one `UNION ALL`, so they are
also one snapshot of the table on either backend (under READ COMMITTED each statement
sees the commits made before it started, so separate statements could disagree). Only a
page longer than one chunk reads on, a chunk at a time, from the last id it was given:
a page never holds more than a chunk of rows it did not need (each may carry a 128K
command).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from typing import Any

from sqlalchemy import BindParameter, bindparam, func, null, select, union_all
from sqlalchemy.sql import CompoundSelect, Select

from gpusched.core.models import ACTIVE_STATES, Job, JobState
from gpusched.store.database import Database
from gpusched.store.rows import job_select, to_job
from gpusched.store.schema import jobs

CHUNK = 200  # rows per statement, as store.queries reads jobs by id

# The two columns the counts' rows add (NULL on the jobs' rows): a state and its count.
_COUNTED_STATE = "counted_state"
_COUNTED = "counted"
_JOB_WIDTH = len(job_select().selected_columns)

# Each statement is built once per kind of page (its states, whether of one user) and
# kept: building this one (two selects of every job column) took longer than running it,
# and a kept statement's cache key is computed once, so SQLAlchemy finds it compiled.
_AFTER: BindParameter[int] = bindparam("after_id")
_LIMIT: BindParameter[int] = bindparam("limit")
_USER: BindParameter[str] = bindparam("user")


@functools.lru_cache(maxsize=64)
def _chunk(wanted: tuple[str, ...], by_user: bool) -> Select[Any]:
    """Up to :limit jobs in `wanted` (of :user) with ids above :after_id, in id order."""
    query = job_select().where(jobs.c.state.in_(wanted), jobs.c.id > _AFTER)
    if by_user:
        query = query.where(jobs.c.user == _USER)
    return query.order_by(jobs.c.id).limit(_LIMIT)


@functools.lru_cache(maxsize=64)
def _chunk_and_counts(wanted: tuple[str, ...], by_user: bool) -> CompoundSelect:
    """_chunk's rows, then one row per active state that has jobs (of :user): the counts'
    rows carry NULL in every job column, the jobs' rows NULL in the counts' two."""
    page = _chunk(wanted, by_user).subquery()
    counted = select(jobs.c.state, func.count().label("n")).where(
        jobs.c.state.in_([str(s) for s in ACTIVE_STATES])
    )
    if by_user:
        counted = counted.where(jobs.c.user == _USER)
    counts = counted.group_by(jobs.c.state).subquery()
    return union_all(
        select(*page.c, null().label(_COUNTED_STATE), null().label(_COUNTED)),
        select(
            *(null().label(c.name) for c in page.c),
            counts.c.state.label(_COUNTED_STATE),
            counts.c.n.label(_COUNTED),
        ),
    )


def read_active_page(
    db: Database,
    after_id: int,
    limit: int,
    states: Collection[JobState] = ACTIVE_STATES,
    user: str | None = None,
) -> tuple[dict[str, int], Iterator[Job]]:
    """How many jobs (of `user` only, if given) are in each active state (every state
    named, zero included), and up to `limit` active jobs in `states` (of `user`) with ids
    above `after_id`, in id order: read a chunk at a time as they are taken, the first
    chunk with the counts, before this returns."""
    wanted = tuple(sorted(str(s) for s in states if s in ACTIVE_STATES))
    first = min(limit, CHUNK)
    params = {"after_id": after_id, "limit": first, "user": user}
    with db.read() as conn:
        rows = conn.execute(_chunk_and_counts(wanted, user is not None), params).all()
    width = _JOB_WIDTH
    found = {str(r[width]): int(r[width + 1]) for r in rows if r[width] is not None}
    counts = {state: found.get(state, 0) for state in sorted(str(s) for s in ACTIVE_STATES)}
    # UNION ALL keeps no order: the page's jobs are put in id order here.
    chunk = sorted((to_job(r[:width]) for r in rows if r[width] is None), key=lambda j: j.id)
    return counts, _page(db, chunk=chunk, asked=first, limit=limit, wanted=wanted, user=user)


def _page(
    db: Database,
    *,
    chunk: list[Job],
    asked: int,
    limit: int,
    wanted: tuple[str, ...],
    user: str | None,
) -> Iterator[Job]:
    """The first chunk, then the next ones while the page wants more and the last chunk
    was full."""
    given = 0
    while True:
        yield from chunk
        given += len(chunk)
        if len(chunk) < asked or given >= limit:
            return
        asked = min(limit - given, CHUNK)
        params = {"after_id": chunk[-1].id, "limit": asked, "user": user}
        with db.read() as conn:
            rows = conn.execute(_chunk(wanted, user is not None), params).all()
        chunk = [to_job(row) for row in rows]
