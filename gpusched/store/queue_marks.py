"""The queue's change marker (issue 30): whether the queue a pass reads may have changed
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


def mark(conn: Connection) -> int | None:
    """The queue's change marker now; None: no counter (read the queue in full)."""
    value = conn.execute(select(func.sum(queue_marks.c.n))).scalar()
    return None if value is None else int(value)
