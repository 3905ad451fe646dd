"""`gpusched kernel install`: a Jupyter kernel that takes its GPU from the queue
(gpusched.interactive.kernelspec writes the spec)."""

from __future__ import annotations

import click

from gpusched.cli.help import ExampleLastGroup


@click.group(cls=ExampleLastGroup)
def kernel() -> None:
    """Jupyter kernels whose GPU comes from the queue.

    \b
    Example:
      gpusched kernel install --mem 8G
    """


@kernel.command()
@click.option("--mem", metavar="SIZE", help="GPU memory per GPU, e.g. 8G. Omit for a whole GPU.")
@click.option("--gpus", type=int, default=1, show_default=True, help="Number of GPUs.")
@click.option("--time", "time_limit", metavar="DURATION", help="Stop the kernel after this long.")
@click.option("--name", help="The kernel's name (default: gpusched-8g for --mem 8G).")
@click.option("--display-name", help="What JupyterLab's launcher shows.")
@click.option(
    "--python",
    metavar="PATH",
    help="The Python whose ipykernel runs the kernel (default: python3 on your PATH).",
)
@click.option("--user", is_flag=True, help="Into your own Jupyter data directory (the default).")
@click.option("--prefix", metavar="DIR", help="Into DIR/share/jupyter/kernels (a venv, conda).")
@click.pass_context
def install(
    ctx: click.Context,
    mem: str | None,
    gpus: int,
    time_limit: str | None,
    name: str | None,
    display_name: str | None,
    python: str | None,
    user: bool,
    prefix: str | None,
) -> None:
    """Write a Jupyter kernelspec whose kernel starts through `gpusched run`: opening a
    notebook with it queues for a GPU (--mem per GPU, --gpus), starts your own Python's
    ipykernel there once placed, holds the GPU while the kernel lives and gives it back
    when it stops. Needs ipykernel in that Python. A kernel waits in the queue like any
    job: raise Jupyter's kernel_info_timeout (60 s) if waits are long (docs/interactive.md).

    \b
    Example:
      gpusched kernel install --mem 8G
      gpusched kernel install --gpus 2 --name two-gpus --prefix "$VIRTUAL_ENV"
    """
    from gpusched.interactive.kernelspec import (
        KernelRequest,
        describe,
        kernels_dir,
        write_kernelspec,
    )

    request = KernelRequest(
        mem=mem,
        gpus=gpus,
        name=name,
        display_name=display_name,
        python=python,
        time_limit=time_limit,
        socket=(ctx.find_root().obj or {}).get("socket"),
    )
    path = write_kernelspec(request, kernels_dir(user, prefix))
    import json

    click.echo(describe(path, json.loads(path.read_text())["argv"]))
