"""`gpusched admin`: an administrator's commands that work on the database directly, not
through a daemon (run as root with the daemon stopped).

The CLI stays a thin client: each command execs the daemon side's own entry point
(`python -m gpusched.store.copy`), so nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import os
import sys

import click

from gpusched.cli.help import ExampleLastCommand, ExampleLastGroup


@click.group(cls=ExampleLastGroup)
def admin() -> None:
    """Administer the database itself (root, with the daemon stopped).

    \b
    Example:
      gpusched admin copy-database --from sqlite:////var/lib/gpusched/gpusched.db \\
          --to postgresql+psycopg://gpusched@dbhost/gpusched
    """


@admin.command("copy-database", cls=ExampleLastCommand)
@click.option("--from", "source", required=True, metavar="URL", help="The database to copy.")
@click.option("--to", "target", required=True, metavar="URL", help="The database to fill.")
@click.option(
    "--merge", is_flag=True, help="The target has jobs already: add these with shifted ids."
)
def copy_database(source: str, target: str, merge: bool) -> None:
    """Copy a queue and its history into another database (e.g. SQLite into PostgreSQL).

    Stop the daemon first. Both databases are brought to this version's schema; the copy
    is one transaction. Into an empty target job ids are kept, so running jobs are
    re-adopted when the daemon starts on it; a target with jobs is refused unless
    --merge (then ids are shifted, `after` dependencies with them; refused while the
    source has running jobs). Keep the password out of the URL: root's ~/.pgpass.

    \b
    Example:
      systemctl stop gpusched
      gpusched admin copy-database --from sqlite:////var/lib/gpusched/gpusched.db \\
          --to postgresql+psycopg://gpusched@dbhost/gpusched
    """
    argv = [sys.executable, "-m", "gpusched.store.copy", "--from", source, "--to", target]
    os.execv(sys.executable, [*argv, "--merge"] if merge else argv)  # noqa: S606
