"""`store.nodes` (`Nodes`): the cluster's tables `nodes` (one row per server, its lease and
its GPUs as last reported) and `leases` (the scheduler's election), their reads and
conditional writes; and the checks that other parts run inside their own transactions
(`election_is_current`, `node_is_live`, the database's clock `db_now` / `db_iso`).

Every lease is timed by the DATABASE's clock (`db_now`; a test injects its own as the
store's `lease_clock`): servers' clocks may disagree, the database's is one. A lease is
renewed by an UPDATE conditioned on the holder's name and epoch, its row count checked:
a node declared down (its epoch bumped) or a scheduler replaced (the election's epoch
bumped) finds its renewal refused, and so is any later write it makes under the old
epoch (store.placements).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.clock import iso
from gpusched.core.models import JobState
from gpusched.store.database import Database
from gpusched.store.schema import jobs, leases, nodes

NODE_UP = "up"
NODE_DOWN = "down"
NODE_DRAINED = "drained"

SCHEDULER_ROLE = "scheduler"


def db_now(conn: Connection, fixed: Callable[[], float] | None = None) -> ColumnElement[float]:
    """The database's clock in seconds since 1970, as an SQL expression (`fixed`: the
    store's injected lease clock instead, in tests)."""
    if fixed is not None:
        return literal(fixed())
    return database_clock(conn.dialect.name)


def database_clock(dialect: str) -> ColumnElement[float]:
    """The database's clock in seconds since 1970, in `dialect`'s SQL."""
    if dialect == "sqlite":
        return (func.julianday("now") - literal(2440587.5)) * literal(86400.0)
    return func.extract("epoch", func.clock_timestamp())  # type: ignore[return-value]


def db_iso(conn: Connection, fixed: Callable[[], float] | None = None) -> str:
    """The database's clock now, as a job's timestamp: one clock for every server."""
    seconds = float(conn.execute(select(db_now(conn, fixed))).scalar_one())
    return iso(datetime.fromtimestamp(seconds, timezone.utc))


@dataclass(frozen=True)
class NodeRow:
    name: str
    epoch: int
    state: str
    drain_reason: str | None
    owner: str | None
    report: dict[str, Any]
    age_s: float  # seconds since it was last heard, by the database's clock
    expired: bool  # its lease has run out (by the database's clock)


def node_columns(now: ColumnElement[float]) -> list[ColumnElement[Any]]:
    """What a NodeRow is read from (node_row_of), `now` being the database's clock; also
    read by a `status` page in its own statement (gpusched.store.active_page)."""
    return [
        nodes.c.name,
        nodes.c.epoch,
        nodes.c.state,
        nodes.c.drain_reason,
        nodes.c.owner,
        nodes.c.report,
        (now - nodes.c.last_seen).label("age"),
        (nodes.c.lease_expires < now).label("expired"),
    ]


def node_row_of(values: Sequence[Any]) -> NodeRow:
    name, epoch, state, drain_reason, owner, report, age, expired = values
    return NodeRow(
        name,
        int(epoch),
        state,
        drain_reason,
        owner,
        json.loads(report) if report else {},
        max(0.0, float(age)),
        bool(expired),
    )


@dataclass(frozen=True)
class LeaseRow:
    holder: str
    epoch: int
    expired: bool


class Nodes:
    """`store.nodes`: reads and conditional writes of `nodes` and `leases`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def waiting_users(self) -> set[str]:
        """The user names of the queued jobs: each node says which of them it lacks. One
        indexed DISTINCT, where reading every queued job cost 0.8 s a pass with 10,000."""
        query = select(jobs.c.user).where(jobs.c.state == str(JobState.QUEUED)).distinct()
        with self.db.read() as conn:
            return {str(user) for user in conn.execute(query).scalars()}

    def node_rows(self) -> list[NodeRow]:
        with self.db.read() as conn:
            query = select(*node_columns(db_now(conn, self.db.lease_clock)))
            rows = conn.execute(query.order_by(nodes.c.name)).all()
        return [node_row_of(r) for r in rows]

    def node_row(self, name: str) -> NodeRow | None:
        return next((r for r in self.node_rows() if r.name == name), None)

    def claim_node(self, name: str, owner: str, timeout_s: float, seen: NodeRow | None) -> int:
        """Take the name `name` for this daemon: its epoch, or -1 if someone else took the
        row meanwhile. A row that was down comes back up with the epoch it was given."""
        with self.db.write() as conn:
            now = db_now(conn, self.db.lease_clock)
            if seen is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(nodes).values(
                                name=name,
                                epoch=1,
                                lease_expires=now + timeout_s,
                                last_seen=now,
                                state=NODE_UP,
                                owner=owner,
                            )
                        )
                except IntegrityError:
                    return -1
                return 1
            state = NODE_DRAINED if seen.state == NODE_DRAINED else NODE_UP
            done = conn.execute(
                update(nodes)
                .where(nodes.c.name == name, nodes.c.epoch == seen.epoch)
                .values(lease_expires=now + timeout_s, last_seen=now, state=state, owner=owner)
            )
        return seen.epoch if done.rowcount == 1 else -1

    def renew_node(
        self, name: str, epoch: int, timeout_s: float, report: dict[str, Any]
    ) -> float | None:
        """Renew this node's lease and report its GPUs: the database's time of the renewal
        (seconds since 1970); None: it was declared down."""
        with self.db.write() as conn:
            now = db_now(conn, self.db.lease_clock)
            renewed = conn.execute(
                update(nodes)
                .where(
                    nodes.c.name == name,
                    nodes.c.epoch == epoch,
                    nodes.c.state.in_([NODE_UP, NODE_DRAINED]),
                )
                .values(lease_expires=now + timeout_s, last_seen=now, report=json.dumps(report))
                .returning(nodes.c.last_seen)
            ).first()
        return None if renewed is None else float(renewed[0])

    def set_node_state(self, name: str, state: str, reason: str | None) -> bool:
        """Drain (`drained`, with why) or undrain (`up`) a node that is not down."""
        with self.db.write() as conn:
            done = conn.execute(
                update(nodes)
                .where(nodes.c.name == name, nodes.c.state.in_([NODE_UP, NODE_DRAINED]))
                .values(state=state, drain_reason=reason)
            )
        return done.rowcount == 1

    def release_node(self, name: str, epoch: int) -> None:
        """A daemon stopping cleanly: its lease ends now (its jobs run on, re-adopted by
        its next start; declared down only if it stays away past node_timeout)."""
        with self.db.write() as conn:
            conn.execute(
                update(nodes).where(nodes.c.name == name, nodes.c.epoch == epoch).values(owner=None)
            )

    # -- the scheduler's election ---------------------------------------------------------

    def scheduler_lease(self) -> LeaseRow | None:
        with self.db.read() as conn:
            row = conn.execute(
                select(
                    leases, (leases.c.expires < db_now(conn, self.db.lease_clock)).label("expired")
                ).where(leases.c.role == SCHEDULER_ROLE)
            ).first()
        return None if row is None else LeaseRow(row.holder, int(row.epoch), bool(row.expired))

    def renew_scheduler(self, holder: str, epoch: int, timeout_s: float) -> bool:
        with self.db.write() as conn:
            done = conn.execute(
                update(leases)
                .where(
                    leases.c.role == SCHEDULER_ROLE,
                    leases.c.holder == holder,
                    leases.c.epoch == epoch,
                )
                .values(expires=db_now(conn, self.db.lease_clock) + timeout_s)
            )
        return done.rowcount == 1

    def take_scheduler(self, holder: str, seen: LeaseRow | None, timeout_s: float) -> int | None:
        """Become the scheduler if the lease seen is still the current one and expired (or
        there is none): the new epoch, or None if another daemon was quicker."""
        with self.db.write() as conn:
            now = db_now(conn, self.db.lease_clock)
            if seen is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(leases).values(
                                role=SCHEDULER_ROLE, holder=holder, epoch=1, expires=now + timeout_s
                            )
                        )
                except IntegrityError:
                    return None
                return 1
            done = conn.execute(
                update(leases)
                .where(
                    leases.c.role == SCHEDULER_ROLE,
                    leases.c.epoch == seen.epoch,
                    # Our own expired lease is taken back at once; another's only when it ran out.
                    (leases.c.expires < now) | (leases.c.holder == holder),
                )
                .values(holder=holder, epoch=seen.epoch + 1, expires=now + timeout_s)
            )
        return seen.epoch + 1 if done.rowcount == 1 else None


def election_is_current(conn: Connection, holder: str, epoch: int) -> bool:
    """In a write transaction: whether `holder` still holds the election at `epoch`.

    The row is read FOR SHARE (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises
    writers), so a takeover waits for this transaction to commit: no write of an old
    scheduler lands after a new one was elected.
    """
    found = conn.execute(
        select(leases.c.epoch)
        .where(leases.c.role == SCHEDULER_ROLE, leases.c.holder == holder, leases.c.epoch == epoch)
        .with_for_update(read=True)
    ).first()
    return found is not None


def node_is_live(
    conn: Connection, name: str, epoch: int, fixed: Callable[[], float] | None = None
) -> bool:
    """In a write transaction: whether node `name` is still at `epoch`, not down, and its
    lease unexpired by the database's clock (read FOR SHARE, as election_is_current)."""
    return live_at(conn, name, epoch, fixed) is not None


def live_at(
    conn: Connection, name: str, epoch: int, fixed: Callable[[], float] | None = None
) -> str | None:
    """`node_is_live`, and the database's clock as a job's timestamp (`db_iso`) if it is,
    in one statement: a claim over a network pays one round trip for both, not two."""
    found = conn.execute(
        select(db_now(conn, fixed))
        .select_from(nodes)
        .where(
            nodes.c.name == name,
            nodes.c.epoch == epoch,
            nodes.c.state.in_([NODE_UP, NODE_DRAINED]),
            nodes.c.lease_expires > db_now(conn, fixed),
        )
        .with_for_update(read=True)
    ).first()
    if found is None:
        return None
    return iso(datetime.fromtimestamp(float(found[0]), timezone.utc))
