"""`gpusched admin`: an administrator's commands about the database: `prune` (asks the
running daemon, the only writer of the database) and `copy-database` (works on the
databases directly, run as root with the daemon stopped).

The CLI stays a thin client: `copy-database` execs the daemon side's own entry point
(`python -m gpusched.store.copy`), so nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import os
import sys

import click

from gpusched.cli.common import client_of
from gpusched.cli.help import ExampleLastCommand, ExampleLastGroup
from gpusched.core.units import format_size, parse_duration


@click.group(cls=ExampleLastGroup)
def admin() -> None:
    """Administer the daemon and its database: apply the config now (reload), forget old
    jobs (prune), copy the database (copy-database: root, with the daemon stopped).

    \b
    Example:
      gpusched admin prune --ended-before 90d --dry-run
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


@admin.command("prune", cls=ExampleLastCommand)
@click.option(
    "--ended-before",
    "ended_before",
    required=True,
    metavar="DURATION",
    help="Forget jobs that ended more than this long ago, e.g. 90d or 12h.",
)
@click.option("--dry-run", is_flag=True, help="Only say how many jobs and log bytes would go.")
@click.pass_context
def prune(ctx: click.Context, ended_before: str, dry_run: bool) -> None:
    """Forget old ended jobs (administrators only): their rows, timelines, logs in
    log_dir and directories in state_dir/jobs. Jobs an active job waits for (--after)
    are kept. `history`, `show` and `estimate --history` no longer find them.

    The daemon also does this by itself with the `retention:` config key; this command
    does it now, with the age you give.

    \b
    Example:
      gpusched admin prune --ended-before 90d --dry-run
      gpusched admin prune --ended-before 90d
    """
    client = client_of(ctx)
    seconds = 0.0 if ended_before.strip() in ("0", "0s") else parse_duration(ended_before)
    jobs, log_bytes, cutoff = 0, 0, ""
    while True:
        done = client.prune(seconds, dry_run=dry_run)
        jobs += int(done["jobs"])
        log_bytes += int(done["log_bytes"])
        cutoff = str(done["cutoff"])
        if dry_run or not done["more"]:
            break
    when = cutoff[:19].replace("T", " ") + " UTC"
    size = format_size(log_bytes, tabular=False)
    if dry_run:
        more = " (at least: the first batch)" if done["more"] else ""
        click.echo(f"would forget {jobs} job(s) ended before {when}{more}, {size} of logs")
    else:
        click.echo(f"forgot {jobs} job(s) ended before {when}, {size} of logs")


@admin.command("reload", cls=ExampleLastCommand)
@click.pass_context
def reload(ctx: click.Context) -> None:
    """Have the daemon read its config file again and apply it now (administrators
    only). A bad file is refused with its error (non-zero exit) and the old config stays; what
    needs a restart to change (socket, database, directories...) is kept and said.
    systemd's `systemctl reload gpusched` runs this, so it reports a rejected config.

    \b
    Example:
      sudo gpusched admin reload
    """
    for note in client_of(ctx).reload():
        click.echo(f"gpusched: {note}", err=True)
    click.echo("config reloaded")
