"""The queue's change marker: whether the queue a pass reads may have changed
since the last read, so that a pass over 10,000 queued jobs, none of them changed, does
not read them all again.

Triggers on `jobs` (revision 0017) bump a counter of `queue_marks` in the same transaction
as every write that changes a row of the queue in a column a pass reads, whichever
process or node writes it. `mark()` is the counters' sum: it only grows, so two equal
marks mean no such write committed between them. Read before the queue, it can only make
a reader read again when it did not need to, never keep a change from it: a write
committed after the mark was read moves the next mark.

When unsure, read in full: a database whose triggers are missing (a table rebuilt by hand,
a later revision that copied `jobs` on SQLite and forgot them) gives no mark at all.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.engine import Connection

from gpusched.store.schema import queue_marks

# Revision 0017's triggers: without all three, the marker says nothing.
TRIGGERS = ("jobs_queue_insert", "jobs_queue_update", "jobs_queue_delete")


def triggers_present(conn: Connection) -> bool:
    """Whether `jobs` has every trigger that bumps the marker (and it is enabled)."""
    if conn.dialect.name == "postgresql":
        query = text(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'jobs'::regclass"
            " AND tgname IN :names AND tgenabled <> 'D'"
        )
    else:
        query = text(
            "SELECT count(*) FROM sqlite_master"
            " WHERE type = 'trigger' AND tbl_name = 'jobs' AND name IN :names"
        )
    query = query.bindparams(bindparam("names", expanding=True))
    return int(conn.execute(query, {"names": list(TRIGGERS)}).scalar_one()) == len(TRIGGERS)


# Built once: its cache key is then hashed once, not at every pass (store.by_id).
_MARK = select(func.sum(queue_marks.c.n), func.count())


def mark(conn: Connection) -> tuple[int | None, int]:
    """The queue's change marker now (None: no counter, read the queue in full), and how
    many counter rows it sums (see `fold`)."""
    value, rows = conn.execute(_MARK).one()
    return (None if value is None else int(value)), int(rows)


# On PostgreSQL a row per server process that ever changed the queue: past this many,
# `fold` sums them into one, so that reading the marker stays one short scan.
FOLD_ROWS = 1000


def fold(conn: Connection) -> None:
    """In a write transaction on PostgreSQL: fold the counter rows of other server
    processes into slot 0, the sum unchanged (so no reader sees a change that is not).
    A row locked by a transaction in progress (one bumping it, maybe a node cut off) is
    skipped, not waited for; a process whose row was folded starts a new one at its
    next bump."""
    conn.execute(
        text(
            "WITH gone AS (DELETE FROM queue_marks WHERE slot IN"
            " (SELECT slot FROM queue_marks WHERE slot <> 0 FOR UPDATE SKIP LOCKED)"
            " RETURNING n)"
            " INSERT INTO queue_marks (slot, n) SELECT 0, coalesce(sum(n), 0) FROM gone"
            " ON CONFLICT (slot) DO UPDATE SET n = queue_marks.n + EXCLUDED.n"
        )
    )
