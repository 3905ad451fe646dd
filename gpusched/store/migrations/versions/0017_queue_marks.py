"""A change marker for the queue (`queue_marks`), so that a pass over 10,000
queued jobs does not read them all again when none changed; and an index on
`jobs.interactive`, so that a pass finds the few interactive jobs among them without
reading every queued row.

Triggers on `jobs` bump a counter in the same transaction as every write that changes a
row of the queue as a pass reads it (`state = 'queued' AND node IS NULL`, before or after
the write) in a column the pass reads: a submit, cancel, hold, release, priority, top,
placement, claim, requeue, a row deleted; a write by any process or node. The waiting
reason and the other columns a pass does not read leave it alone. The counters only grow
and their rows are never deleted, so their sum changes at every such commit, whatever the
order the transactions commit in (gpusched.store.queue_marks reads it).

On PostgreSQL each server process (backend) bumps its own row (`slot` = its pid), so two
writers never wait on each other's counter: a node cut off inside a transaction holds only
its own row's lock; the triggers run once a statement, bumping by the rows it changed in
the queue. On SQLite, where writers take turns anyway, there is one row (slot 0), bumped
once a row. Either way each row of the queue a statement changes moves the marker by one
(store.jobs.left_queue counts on it).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# The queue as a pass reads it (store.queued.QUEUED_SELECT), and the columns it read at
# this revision (store.queued.Queued's fields; `command` for command_json); later
# revisions add theirs (0018: `after_when`), and tests/test_queue_marks.py checks that
# the head's list covers them.
_IN_QUEUE = "({row}.state = 'queued' AND {row}.node IS NULL)"
QUEUE_COLUMNS = (
    "state",
    "node",
    "id",
    "user",
    "uid",
    "name",
    "command",
    "mem",
    "gpus",
    "priority",
    "after",
    "array_id",
    "max_concurrent",
    "retry_of",
    "interactive",
    "allowed_nodes",
    "time_limit_s",
    "submitted_at",
    "exclusive",
    "share",
    "top",
)
JSON_COLUMNS = ("command", "after", "allowed_nodes")  # PostgreSQL's json has no "="
TRIGGERS = ("jobs_queue_insert", "jobs_queue_update", "jobs_queue_delete")


def _changed(dialect: str, columns: Sequence[str], json_columns: Sequence[str]) -> str:
    def value(row: str, column: str) -> str:
        named = f'{row}."{column}"'
        return f"{named}::text" if dialect == "postgresql" and column in json_columns else named

    if dialect == "postgresql":
        old = ", ".join(value("OLD", c) for c in columns)
        new = ", ".join(value("NEW", c) for c in columns)
        return f"ROW({old}) IS DISTINCT FROM ROW({new})"
    return " OR ".join(f'OLD."{c}" IS NOT NEW."{c}"' for c in columns)


def _update_when(dialect: str, columns: Sequence[str], json_columns: Sequence[str]) -> str:
    either = f"{_IN_QUEUE.format(row='OLD')} OR {_IN_QUEUE.format(row='NEW')}"
    return f"({either}) AND ({_changed(dialect, columns, json_columns)})"


def _whens(
    dialect: str, columns: Sequence[str], json_columns: Sequence[str]
) -> dict[str, tuple[str, str]]:
    """Each trigger's event and its condition."""
    return {
        "jobs_queue_insert": ("INSERT", _IN_QUEUE.format(row="NEW")),
        "jobs_queue_update": ("UPDATE", _update_when(dialect, columns, json_columns)),
        "jobs_queue_delete": ("DELETE", _IN_QUEUE.format(row="OLD")),
    }


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if "ix_jobs_interactive" not in {index["name"] for index in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_interactive", "jobs", ["interactive"])
    if not inspector.has_table("queue_marks"):
        op.create_table(
            "queue_marks",
            sa.Column("slot", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("n", sa.BigInteger, nullable=False),
        )
    create_triggers(bind.dialect.name, QUEUE_COLUMNS, JSON_COLUMNS)


def create_triggers(dialect: str, columns: Sequence[str], json_columns: Sequence[str]) -> None:
    """The triggers (made again if there): an update bumps the marker when it changes one
    of `columns` of a row in the queue (`json_columns`: those of them that are JSON). A
    later revision that adds a column a pass reads calls it with its longer list."""
    if dialect == "postgresql":
        # One trigger a statement, not a row: it counts the rows it changed in the queue
        # (its transition tables) and bumps by that many, one upsert a statement, so a
        # 10,000-job cancel is not 10,000 upserts of one row.
        in_queue = _IN_QUEUE.format(row="r")
        old = _IN_QUEUE.format(row="o")
        new = _IN_QUEUE.format(row="n")
        changed = (
            _changed(dialect, columns, json_columns).replace("OLD.", "o.").replace("NEW.", "n.")
        )
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION gpusched_queue_mark() RETURNS trigger
            LANGUAGE plpgsql AS $$
            DECLARE k bigint;
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    SELECT count(*) INTO k FROM new_rows r WHERE {in_queue};
                ELSIF TG_OP = 'DELETE' THEN
                    SELECT count(*) INTO k FROM old_rows r WHERE {in_queue};
                ELSE
                    SELECT count(*) INTO k FROM old_rows o JOIN new_rows n ON n.id = o.id
                    WHERE ({old} OR {new}) AND ({changed});
                END IF;
                IF k > 0 THEN
                    INSERT INTO queue_marks (slot, n) VALUES (pg_backend_pid(), k)
                    ON CONFLICT (slot) DO UPDATE SET n = queue_marks.n + EXCLUDED.n;
                END IF;
                RETURN NULL;
            END $$
            """  # noqa: S608 (this revision's own constants)
        )
        tables = {
            "INSERT": "NEW TABLE AS new_rows",
            "UPDATE": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
            "DELETE": "OLD TABLE AS old_rows",
        }
        for name, (event, _) in _whens(dialect, columns, json_columns).items():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON jobs")
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON jobs REFERENCING {tables[event]}"
                " FOR EACH STATEMENT EXECUTE FUNCTION gpusched_queue_mark()"
            )
        return
    op.execute(
        "INSERT INTO queue_marks (slot, n)"
        " SELECT 0, 0 WHERE NOT EXISTS (SELECT 1 FROM queue_marks WHERE slot = 0)"
    )
    bump = "UPDATE queue_marks SET n = n + 1 WHERE slot = 0;"
    for name, (event, when) in _whens(dialect, columns, json_columns).items():
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute(f"CREATE TRIGGER {name} AFTER {event} ON jobs WHEN {when} BEGIN {bump} END")


def downgrade() -> None:
    bind = op.get_bind()
    for name in TRIGGERS:
        if bind.dialect.name == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON jobs")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    if bind.dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gpusched_queue_mark()")
    op.drop_table("queue_marks")
    op.drop_index("ix_jobs_interactive", "jobs")
