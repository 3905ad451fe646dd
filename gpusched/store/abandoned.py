"""Ending the PostgreSQL backends that their daemon abandoned in the middle of a pipeline.

A batch of statements (an `executemany`, which the driver sends as a pipeline: a Bind and
an Execute per row, one Sync at the end) cut by a partition after an Execute and before
its Sync leaves its backend `active`, waiting for the client (ClientRead), holding every
lock its transaction took. No server bound ends it: it is neither idle in a transaction
(`idle_in_transaction_session_timeout`) nor running a statement (`statement_timeout`);
only TCP keepalives do, and a peer that stays up answers them (a connection pooler or a
TCP proxy between the daemons and the database). Its daemon gave up on it long before,
at its own wait bound (gpusched.store.waits), so each daemon's pass, first thing, ends
such a backend of the daemons' role once it has waited on its client for
ABANDONED_AFTER_S: one query at most once every CHECK_EVERY_S (scheduling.phases;
tests/test_abandoned.py).
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

from gpusched.store.database import Database
from gpusched.store.engine import WAIT_BOUND_S

log = logging.getLogger("gpusched.database")

# Three times the daemons' own wait for any one answer (store.waits): a daemon whose
# backend waits this long on it has long since closed its end.
ABANDONED_AFTER_S = 3 * WAIT_BOUND_S
CHECK_EVERY_S = 5.0

_END_ABANDONED = text(
    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = current_database() AND usename = current_user"
    " AND pid <> pg_backend_pid() AND state = 'active' AND wait_event = 'ClientRead'"
    " AND xact_start IS NOT NULL"
    " AND state_change < now() - make_interval(secs => :older_than_s)"
)


def end_abandoned(conn: Connection, older_than_s: float = ABANDONED_AFTER_S) -> list[int]:
    """End the backends of this role waiting mid-transaction on a client for longer than
    `older_than_s`; their pids. Nothing on SQLite (one process, no such backend)."""
    if conn.dialect.name != "postgresql":
        return []
    rows = conn.execute(_END_ABANDONED, {"older_than_s": older_than_s}).all()
    return [int(pid) for pid, ended in rows if ended]


class AbandonedBackends:
    """A node's look for abandoned backends, at most once every CHECK_EVERY_S."""

    def __init__(self) -> None:
        self._looked = float("-inf")  # monotonic seconds

    def end_due(self, db: Database, now: float) -> None:
        if db.engine.dialect.name != "postgresql" or now - self._looked < CHECK_EVERY_S:
            return  # (SQLite: one process, no such backend; not even a connection)
        self._looked = now
        with db.read() as conn:
            for pid in end_abandoned(conn):
                log.warning("ended database backend %s: abandoned in a transaction", pid)
