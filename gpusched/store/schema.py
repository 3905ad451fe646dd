"""The schema's version: the database is brought to this gpusched's schema at open.

The revisions are Alembic's, shipped in gpusched/store/migrations (no alembic.ini at run
time). At each start the daemon runs every revision its database lacks, in one
transaction: on SQLite under BEGIN IMMEDIATE, on PostgreSQL under a transaction-level
advisory lock, so that daemons starting together on one database upgrade it once. A
database of a version before Alembic (no alembic_version table) is adopted by the first
revision, which adds only what it lacks (see its docstring). A database whose revision
this gpusched does not know, written by a newer one, is refused: an older daemon
writing rows that a newer schema reads differently could lose jobs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection

from gpusched.core.errors import GpuschedError

log = logging.getLogger("gpusched.store")

MIGRATIONS = Path(__file__).with_name("migrations")

# pg_advisory_xact_lock's key for "upgrading the schema" (any constant: only we take it).
_UPGRADE_LOCK = 0x67707573  # "gpus"


class SchemaTooNew(GpuschedError):
    """The database was upgraded by a newer gpusched than this one."""


def _alembic_config(conn: Connection) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def head_revision() -> str:
    """The newest revision this gpusched knows."""
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    if head is None:  # only if the package lost its migrations
        raise RuntimeError(f"no schema revision in {MIGRATIONS}")
    return head


def current_revisions(conn: Connection) -> tuple[str, ...]:
    """The revisions the database says it is at; () for a new or pre-Alembic database."""
    return tuple(MigrationContext.configure(conn).get_current_heads())


def _check_known(conn: Connection, where: str) -> None:
    script = ScriptDirectory(str(MIGRATIONS))
    for revision in current_revisions(conn):
        try:
            script.get_revision(revision)
        except CommandError:
            raise SchemaTooNew(
                f"the database {where} has schema revision {revision}, newer than this"
                f" gpusched knows ({head_revision()}): upgrade gpusched on this server"
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


def upgrade(engine: Engine, where: str) -> None:
    """Bring the database to the head revision, or raise SchemaTooNew (one line)."""
    with _alembic_quiet(), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _UPGRADE_LOCK})
        _check_known(conn, where)
        before = current_revisions(conn)
        head = head_revision()
        if before == (head,):
            return  # the usual start: nothing to do
        command.upgrade(_alembic_config(conn), "head")
    log.info(
        "database %s: schema %s -> %s",
        where,
        ",".join(before) or "(none: new, or made before schema revisions)",
        head,
    )
