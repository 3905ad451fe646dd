"""A damaged SQLite database, told in one line: the file, what is wrong with it, and the
documented restore (docs/operations.md, "Back up the database").

Three checks, each refusing with `DamagedDatabase`:
- before it is opened (`check_file`): a file that does not start with SQLite's header (a
  text file, random bytes, an overwritten header) is no database; an empty one is a new
  queue only when nothing shows an earlier run, since SQLite reads an empty file as an
  empty database and the queue would silently start again at job 1. The daemon says what
  an earlier run leaves (`earlier_run`, gpusched.daemon.process_setup); a crash before
  the first migration leaves an empty file and none of that.
- when SQLite itself says so while opening it (`is_damage`: "file is not a database",
  "database disk image is malformed", as a truncated file reads).
- once open (`quick_check`): SQLite's PRAGMA quick_check, which reads every page (a
  zeroed page is found here), in a fraction of a second for a database of 100,000 jobs.
The damaged file is left as it was found, for a look or a repair.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from gpusched.core.errors import GpuschedError

SQLITE_HEADER = b"SQLite format 3\x00"
# SQLite's result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
DAMAGE_CODES = frozenset({11, 26})
DAMAGE_WORDS = ("file is not a database", "malformed")
RESTORE = (
    "put the last backup in its place (mode 0600, owner root) and start the daemon again"
    ' (docs/operations.md, "Back up the database")'
)


class DamagedDatabase(GpuschedError):
    """The database file is damaged or not a database; the message says how to restore."""


def damaged(path: Path, what: str, also: str = "") -> DamagedDatabase:
    return DamagedDatabase(f"the database {path} {what}: {RESTORE}{also}")


def check_file(path: Path, earlier_run: str | None) -> None:
    """Refuse a file that is no SQLite database, or an empty one where `earlier_run`
    (what an earlier run left, in words; None: nothing) shows the queue had jobs."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GpuschedError(f"the database {path} cannot be read: {exc.strerror}") from None
    if not head:
        if earlier_run is not None:
            raise damaged(
                path,
                f"is empty (0 bytes) although {earlier_run}",
                "; or, to start a new, empty queue (job ids from 1), remove it",
            )
        return
    if head != SQLITE_HEADER:
        raise damaged(path, "is not an SQLite database (its first bytes are not SQLite's)")


def is_damage(exc: BaseException) -> bool:
    """Whether a database error says its file is damaged or is not a database."""
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlite_errorcode", None) in DAMAGE_CODES:
        return True
    return any(words in str(exc.orig) for words in DAMAGE_WORDS)


def first_line(exc: DBAPIError) -> str:
    said = str(exc.orig).strip()
    return said.splitlines()[0] if said else type(exc.orig).__name__


def quick_check(engine: Engine, path: Path) -> None:
    """PRAGMA quick_check on an open SQLite database; DamagedDatabase with its first
    finding when it finds any."""
    try:
        with engine.connect().execution_options(gpusched_read=True) as conn:
            found = conn.execute(text("PRAGMA quick_check(1)")).scalar()
    except DBAPIError as exc:
        if not is_damage(exc):
            raise
        found = first_line(exc)
    if found != "ok":
        # Its first finding, on one line: "*** in database main ***" heads a list.
        lines = [line for line in str(found).splitlines() if not line.startswith("***")]
        raise damaged(path, f"is damaged ({'; '.join(lines)})")


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL; None for another database or one in memory."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///"))
    return None
