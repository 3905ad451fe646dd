"""The store's schema history as Alembic revisions (versions/), and their running: the
database is brought to this gpusched's schema at open.

The revisions are Alembic's, shipped in gpusched/store/migrations (no alembic.ini at run
time). At each start the daemon runs every revision its database lacks, in one
transaction: on SQLite under BEGIN IMMEDIATE, on PostgreSQL under a transaction-level
advisory lock, so that daemons starting together on one database upgrade it once. A
database of a version before Alembic (no alembic_version table) is adopted by the first
revision, which adds only what it lacks (see its docstring). A database whose revision
this gpusched does not know, written by a newer one, is refused: an older daemon
writing rows that a newer schema reads differently could lose jobs.

The usual start finds the database at HEAD with one plain query, without importing
Alembic (a quarter of a second of a daemon's start on a slow machine); Alembic is loaded
only to upgrade or to explain a revision it does not know.

A developer adds a revision (from script.py.mako beside this file) with

    python -c "from alembic.config import Config; from alembic import command; \\
        c = Config(); c.set_main_option('script_location', 'gpusched/store/migrations'); \\
        command.revision(c, 'what changed', rev_id='0002')"

then writes its upgrade() with `op` calls, changes gpusched.store.schema's tables to
match (tests/test_schema.py compares them), sets HEAD below to the new revision (checked
too), copies any new table in gpusched.store.copy, and runs `ruff format`. Every revision
must run on SQLite and PostgreSQL (test_schema runs them on both); on SQLite, change a column
inside `with op.batch_alter_table(...)`, which copies the table.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from gpusched.core.errors import GpuschedError
from gpusched.store.waits import unbounded

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

log = logging.getLogger("gpusched.store")

MIGRATIONS = Path(__file__).parent

# The newest revision in migrations/versions (tests/test_schema.py checks it is Alembic's
# head): a new revision moves it.
HEAD = "0022"

# pg_advisory_xact_lock's key for "upgrading the schema" (any constant: only we take it).
_UPGRADE_LOCK = 0x67707573  # "gpus"


class SchemaTooNew(GpuschedError):
    """The database was upgraded by a newer gpusched than this one."""


def _alembic_config(conn: Connection) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def current_revisions(conn: Connection) -> tuple[str, ...]:
    """The revisions the database says it is at; () for a new or pre-Alembic database."""
    if not inspect(conn).has_table("alembic_version"):
        return ()
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
    return tuple(sorted(str(revision) for revision in rows))


def _check_known(revisions: tuple[str, ...], where: str) -> None:
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

    script = ScriptDirectory(str(MIGRATIONS))
    for revision in revisions:
        try:
            script.get_revision(revision)
        except CommandError:
            raise SchemaTooNew(
                f"the database {where} has schema revision {revision}, newer than this"
                f" gpusched knows ({HEAD}): upgrade gpusched on this server"
            ) from None


@contextlib.contextmanager
def _alembic_quiet() -> Iterator[None]:
    """Alembic says a few lines at INFO each time it looks at a database; we say one."""
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_log.setLevel(level)


def lift_server_bounds(conn: Connection) -> None:
    """This transaction only: none of the server's timeouts (docs/cluster.md section 1)."""
    for setting in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"):
        conn.exec_driver_sql(f"SET LOCAL {setting} = 0")


def upgrade(engine: Engine, where: str) -> None:
    """Bring the database to HEAD, or raise SchemaTooNew (one line)."""
    # Waiting for another daemon's upgrade, or a long migration, is no fault: no bound.
    with unbounded(), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            lift_server_bounds(conn)
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _UPGRADE_LOCK})
        before = current_revisions(conn)
        if before == (HEAD,):
            return  # the usual start: nothing to do
        with _alembic_quiet():
            _check_known(before, where)
            from alembic import command

            command.upgrade(_alembic_config(conn), "head")
    log.info(
        "database %s: schema %s -> %s",
        where,
        ",".join(before) or "(none: new, or made before schema revisions)",
        HEAD,
    )
