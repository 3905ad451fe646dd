"""What one page of `status` reads of the jobs: the page's active jobs, in id order, and
how many jobs are in each active state, the first chunk of the page and the counts in
one statement.

On PostgreSQL every statement is a round trip to another process; on SQLite it is a read
of a file in the daemon's own. Rather than three statements (the page's ids, their
rows, the counts) plus a transaction's BEGIN and ROLLBACK, the page's first chunk (its
rows straight away, no ids first) and the counts are one `UNION ALL`, so they are also
one snapshot of the table on either backend (under READ COMMITTED each statement
sees the commits made before it started, so separate statements could disagree). Only a
page longer than one chunk reads on, a chunk at a time, from the last id it was given:
a page never holds more than a chunk of rows it did not need (each may carry a 128K
command).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BindParameter,
    Boolean,
    Float,
    Integer,
    Text,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.sql import CompoundSelect, Select
from sqlalchemy.types import TypeEngine

from gpusched.core.models import ACTIVE_STATES, Job, JobState
from gpusched.store.database import Database
from gpusched.store.nodes import NodeRow, database_clock, node_columns, node_row_of
from gpusched.store.rows import job_select, to_job
from gpusched.store.schema import jobs

CHUNK = 200  # rows per statement, as store.queries reads jobs by id

# Each statement is built once per kind of page (its states, whether of one user, whether
# with the nodes and by which clock) and kept: building this one (two selects of every job
# column) took longer than running it, and a kept statement's cache key is computed once,
# so SQLAlchemy finds it compiled.
_AFTER: BindParameter[int] = bindparam("after_id", type_=Integer)
_LIMIT: BindParameter[int] = bindparam("limit", type_=Integer)
_USER: BindParameter[str] = bindparam("user", type_=Text)
_FIXED_NOW: BindParameter[float] = bindparam("lease_now", type_=Float)  # a test's clock

# What each row of the first read is: its first column says, the others are the job's
# columns, then the count's two, then the node's, those of the other parts NULL.
_JOB, _COUNT, _NODE = 0, 1, 2
_JOB_WIDTH = len(job_select().selected_columns)
_COUNT_WIDTH = 2
# node_columns' types: name, epoch, state, drain_reason, owner, report, age, expired.
_NODE_TYPES: tuple[TypeEngine[Any], ...] = (
    Text(),
    Integer(),
    Text(),
    Text(),
    Text(),
    Text(),
    Float(),
    Boolean(),
)
_NODE_WIDTH = len(_NODE_TYPES)


@dataclass(frozen=True)
class ActivePage:
    """A `status` page's reads (read_active_page)."""

    counts: dict[str, int]  # active state -> how many jobs are in it, every state named
    jobs: Iterator[Job]  # in id order, read a chunk at a time as they are taken
    nodes: list[NodeRow] | None  # every node of the cluster, by name (None: not asked)


@functools.lru_cache(maxsize=64)
def _chunk(wanted: tuple[str, ...], by_user: bool) -> Select[Any]:
    """Up to :limit jobs in `wanted` (of :user) with ids above :after_id, in id order."""
    query = job_select().where(jobs.c.state.in_(wanted), jobs.c.id > _AFTER)
    if by_user:
        query = query.where(jobs.c.user == _USER)
    return query.order_by(jobs.c.id).limit(_LIMIT)


def _row(
    part: int, columns: list[Any], before: int, after: list[TypeEngine[Any] | None]
) -> Select[Any]:
    """One part's select, padded with NULL columns to the first read's shape: `before`
    untyped, then `columns`, then one per type in `after` (None: untyped)."""
    padded: list[Any] = [literal_column(str(part)).label("part")]
    padded += [null().label(f"before_{i}") for i in range(before)]
    padded += columns
    padded += [
        (null() if kind is None else cast(null(), kind)).label(f"after_{i}")
        for i, kind in enumerate(after)
    ]
    query: Select[Any] = select(*padded)
    return query


@functools.lru_cache(maxsize=64)
def _first_read(wanted: tuple[str, ...], by_user: bool, clock: str | None) -> CompoundSelect:
    """_chunk's rows, one row per active state that has jobs (of :user) and its count, and
    with a `clock` (a dialect's name, or "fixed": :lease_now) every node's row."""
    page = _chunk(wanted, by_user).subquery()
    counted = select(jobs.c.state, func.count().label("n")).where(
        jobs.c.state.in_([str(s) for s in ACTIVE_STATES])
    )
    if by_user:
        counted = counted.where(jobs.c.user == _USER)
    counts = counted.group_by(jobs.c.state).subquery()
    # PostgreSQL types a UNION's columns a pair of parts at a time, and two untyped NULLs
    # make text: the jobs' part (first) types its padding for the nodes' columns, which
    # the nodes' part casts to the same types.
    parts = [
        _row(_JOB, list(page.c), 0, [None] * _COUNT_WIDTH + list(_NODE_TYPES)),
        _row(_COUNT, [counts.c.state, counts.c.n], _JOB_WIDTH, [None] * _NODE_WIDTH),
    ]
    if clock is not None:
        now = _FIXED_NOW if clock == "fixed" else database_clock(clock)
        typed = [cast(c, kind) for c, kind in zip(node_columns(now), _NODE_TYPES, strict=True)]
        parts.append(_row(_NODE, typed, _JOB_WIDTH + _COUNT_WIDTH, []))
    return union_all(*parts)


def read_active_page(
    db: Database,
    after_id: int,
    limit: int,
    states: Collection[JobState] = ACTIVE_STATES,
    user: str | None = None,
    *,
    with_nodes: bool = False,
) -> ActivePage:
    """How many jobs (of `user` only, if given) are in each active state, up to `limit`
    active jobs in `states` (of `user`) with ids above `after_id`, and `with_nodes` the
    cluster's nodes: the counts, the nodes and the page's first chunk in one statement,
    before this returns; the rest of the page as it is taken."""
    wanted = tuple(sorted(str(s) for s in states if s in ACTIVE_STATES))
    first = min(limit, CHUNK)
    params: dict[str, Any] = {"after_id": after_id, "limit": first, "user": user}
    with db.read() as conn:
        clock = None
        if with_nodes:
            clock = conn.dialect.name if db.lease_clock is None else "fixed"
            params["lease_now"] = None if db.lease_clock is None else db.lease_clock()
        rows = conn.execute(_first_read(wanted, user is not None, clock), params).all()
    job_rows = [r[1 : 1 + _JOB_WIDTH] for r in rows if r[0] == _JOB]
    at = 1 + _JOB_WIDTH
    found = {str(r[at]): int(r[at + 1]) for r in rows if r[0] == _COUNT}
    at += _COUNT_WIDTH
    node_rows = [node_row_of(r[at:]) for r in rows if r[0] == _NODE]
    # UNION ALL keeps no order: the page's jobs and the nodes are put in order here.
    chunk = sorted((to_job(r) for r in job_rows), key=lambda job: job.id)
    return ActivePage(
        counts={state: found.get(state, 0) for state in sorted(str(s) for s in ACTIVE_STATES)},
        jobs=_page(db, chunk=chunk, asked=first, limit=limit, wanted=wanted, user=user),
        nodes=sorted(node_rows, key=lambda node: node.name) if with_nodes else None,
    )


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
