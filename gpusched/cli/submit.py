"""`gpusched submit`: queue a command (or a --sweep array of them) and print its id.

Its options become one request through the client (`Client.submit`, `submit_sweep`);
`--mem auto` asks the daemon's history first (cli/estimate.py). The commands that act on
existing jobs are cli/jobs.py's; cli/group.py registers it lazily (and
cli/fast.py answers its commonest form without click, through cli/submit_view.py).
"""

from __future__ import annotations

from typing import Any

import click

from gpusched.cli.common import client_of, host_options, placement_options, print_json
from gpusched.cli.estimate import auto_mem
from gpusched.cli.help import ExampleLastCommand
from gpusched.cli.submit_view import job_options, submitted_text
from gpusched.core.errors import UsageError
from gpusched.core.models import Job


@click.command(cls=ExampleLastCommand, context_settings={"ignore_unknown_options": True})
@click.option(
    "--mem",
    metavar="SIZE",
    help="GPU memory per GPU, with a unit (G = Gi = GiB = 2^30 bytes), at least 256M, e.g. 8G"
    " or 512M. Omit for a whole GPU. 'auto': from the peaks"
    " of your earlier runs of the same command (see `gpusched estimate --history`).",
)
@click.option("--gpus", type=int, default=1, show_default=True, help="Number of GPUs.")
@click.option("--name", help="A name to show in status.")
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="Higher starts first, among your own jobs (never before another user's).",
)
@click.option(
    "--after",
    metavar="ID[:WHEN],...",
    help="Start only after these jobs (or arrays, aN) ended so. WHEN: ok (succeeded, the"
    " default), any (ended, however) or failed (ended without succeeding: failed,"
    " cancelled, lost; job ids only). If one can no longer, the job is cancelled"
    " (reason dependency_failed).",
)
@click.option("--hold", is_flag=True, help="Queue the job held; start it with `gpusched release`.")
@click.option(
    "--cwd", type=click.Path(file_okay=False), help="Working directory (default: the current one)."
)
@click.option(
    "--output",
    metavar="PATH",
    help="Write the job's output to PATH (created or emptied, as you; relative to the"
    " working directory) instead of the daemon's log_dir; {id}, {array} and {index} in its"
    " file name become the job's id, its sweep's id and its index in the sweep (a sweep"
    " needs {id} or {index}). `gpusched logs` reads it.",
)
@click.option(
    "--time",
    "time_limit",
    metavar="DURATION",
    help="Stop the job (SIGTERM, then SIGKILL) if it runs longer, e.g. 2h or 30m.",
)
@click.option(
    "--sweep",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="Submit one job per value (repeat for a cartesian product); {NAME} in the"
    " command is replaced. The jobs form an array (id aN).",
)
@click.option(
    "--max-concurrent",
    type=int,
    metavar="K",
    help="With --sweep: at most K jobs of the array run at once.",
)
@click.option(
    "--notify",
    metavar="CMD",
    help="When the job ends, run CMD as you with the job's JSON on stdin. CMD is split"
    " into words like a shell would but never run by one: write sh -c '...' for a shell.",
)
@click.option(
    "--retry-oom",
    type=click.IntRange(0, 10),
    default=0,
    metavar="N",
    help="If the job runs out of GPU memory, queue it again in its place with 1.5x --mem"
    " rounded up to a whole G (at most what the largest GPU gives), up to N times.",
)
@click.option(
    "--node",
    "nodes",
    metavar="A,B",
    help="In a cluster, run only on these servers (node names, separated by commas).",
)
@click.option(
    "--requeue",
    is_flag=True,
    help="In a cluster, if the server running the job dies, queue it again (default: lost).",
)
@placement_options
@host_options()
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON instead of its id.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def submit(
    ctx: click.Context,
    mem: str | None,
    gpus: int,
    name: str | None,
    priority: int,
    after: str | None,
    hold: bool,
    cwd: str | None,
    time_limit: str | None,
    sweep: tuple[str, ...],
    max_concurrent: int | None,
    as_json: bool,
    command: tuple[str, ...],
    notify: str | None = None,
    retry_oom: int = 0,
    nodes: str | None = None,
    requeue: bool = False,
    exclusive: bool = False,
    share: bool = False,
    output: str | None = None,
    **host: Any,  # --ram, --cpus (host_options)
) -> None:
    """Queue COMMAND; print the new job's id (with --sweep, one id per line).

    The job runs with your environment, working directory and arguments (never
    through a shell) when a GPU has --mem available. A first word ending in .py
    that is not executable runs with the python on your PATH. Put -- before the
    command when its own options could be mistaken for gpusched's.

    \b
    Example:
      id=$(gpusched submit --mem 10G -- python train.py --epochs 5)
      gpusched submit --mem 2G --after $id:any -- python cleanup.py
      gpusched submit train.py --mem 8G
      gpusched submit --mem 8G --notify 'mail -s "job done" me@lab.org' -- python train.py
      gpusched submit --mem 8G --sweep lr=0.1,0.01 --sweep bs=32,64 \\
          --max-concurrent 2 -- python train.py --lr {lr} --bs {bs}
    """
    if max_concurrent is not None and not sweep:  # Client.submit has no such parameter
        raise UsageError("--max-concurrent applies to a --sweep array")
    if mem == "auto" and sweep:
        # --mem is fixed at submit and a sweep's jobs are all queued at once, each with its
        # own command: none has a run to learn from, nor can learn from its siblings'.
        raise UsageError(
            "--mem auto learns from earlier runs of the same command, and a sweep's jobs"
            " each have their own, queued together: give --mem (`gpusched estimate"
            " --history -- CMD` on one of its commands, once it has run, suggests one)"
        )
    client = client_of(ctx)
    options = job_options(
        mem=mem,
        gpus=gpus,
        name=name,
        priority=priority,
        after=after,
        hold=hold,
        cwd=cwd,
        time_limit=time_limit,
        notify=notify,
        retry_oom=retry_oom,
        nodes=nodes,
        requeue=requeue,
        exclusive=exclusive,
        share=share,
        output=output,
        **host,
        array_jobs=lambda array_id: [job.id for job in client.array(array_id)],
    )
    if options["mem"] == "auto" and not sweep:
        options["mem"] = auto_mem(client, list(command), cwd)
    if sweep:
        from gpusched.core.requests.sweep import parse_sweep_option  # only --sweep needs it

        pairs = [parse_sweep_option(item) for item in sweep]
        jobs = client.submit_sweep(list(command), pairs, max_concurrent=max_concurrent, **options)
        _print_array(jobs, as_json)
        return
    click.echo(submitted_text(client.submit(list(command), **options).to_json(), as_json))


def _print_array(jobs: list[Job], as_json: bool) -> None:
    """A sweep's jobs: their ids, one a line (the array's id on stderr), or the JSON list."""
    if as_json:
        print_json([j.to_json() for j in jobs])
        return
    click.echo("\n".join(str(j.id) for j in jobs))
    click.echo(f"array a{jobs[0].array_id}: {len(jobs)} jobs", err=True)
