"""The command line's view of what jobs use: `estimate` and `--mem auto` (the usage rows of
`show` are cli/show_view.py's).

Kept apart from cli/group.py so that module stays a list of commands; like it, this imports
no SQLAlchemy, APScheduler or pynvml (the estimate is `gpusched.cli.sizing`, pure).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import click

from gpusched.cli.help import ExampleLastCommand
from gpusched.client import Client
from gpusched.core.errors import GpuschedError, NotFoundError, UsageError
from gpusched.core.models import Job
from gpusched.core.sanitize import shown
from gpusched.core.units import format_size, parse_size

LARGEST_CARD_BYTES = 141 * 10**9  # an H200: past this, no single GPU holds the job


def auto_mem(client: Client, command: Sequence[str], cwd: str | None) -> int:
    """`submit --mem auto`: the suggestion from history, said on stderr; refuses without one."""
    from gpusched.core.hints import mem_option

    try:
        info = client.estimate_history(command, cwd=cwd)
    except NotFoundError as exc:
        raise NotFoundError(f"--mem auto: {exc.message}") from None
    mem = int(info["suggested_mem"])
    ids = ", ".join(str(run["id"]) for run in info["jobs"])
    click.echo(
        f"gpusched: --mem auto: {mem_option(mem)}"
        f" (peak {format_size(info['peak_mem'], tabular=False)}"
        f" over {len(info['jobs'])} earlier run(s): job {ids})",
        err=True,
    )
    return mem


def follow_retries(client: Client, jobs: list[Job], deadline: float | None) -> list[Job]:
    """For `wait`: a job that ran out of memory and was retried is followed to its retry."""
    while any(job.retried_as is not None for job in jobs):
        for job in jobs:
            if job.retried_as is not None:
                click.echo(
                    f"gpusched: job {job.id} ran out of GPU memory; waiting for its retry,"
                    f" job {job.retried_as}",
                    err=True,
                )
        ids = [job.retried_as if job.retried_as is not None else job.id for job in jobs]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        jobs = client.wait(ids, timeout=remaining)
    return jobs


@click.command(cls=ExampleLastCommand, context_settings={"ignore_unknown_options": True})
@click.option("--params", metavar="N", help="Model parameters: 7B, 350M, 125000000...")
@click.option(
    "--dtype",
    default="fp32",
    show_default=True,
    help="The weights' dtype: fp32, bf16, fp16 (training or inference); fp8, int8, int4"
    " (inference).",
)
@click.option(
    "--optimizer",
    default="adamw",
    show_default=True,
    help="adamw, adam, sgd-momentum or sgd.",
)
@click.option("--inference", is_flag=True, help="No gradients, no optimizer (torch.no_grad()).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--per-sample", metavar="SIZE", help="Activation memory per sample, e.g. 1.2G.")
@click.option(
    "--context",
    metavar="SIZE",
    default="512M",
    show_default=True,
    help="CUDA context, kernels and allocator per process.",
)
@click.option(
    "--history", is_flag=True, help="Suggest --mem from the peaks of your runs of COMMAND."
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def estimate(  # noqa: PLR0917 - click passes one positional argument per option
    ctx: click.Context,
    params: str | None,
    dtype: str,
    optimizer: str,
    inference: bool,
    batch: int,
    per_sample: str | None,
    context: str,
    history: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Estimate the GPU memory a job needs, and the --mem to submit it with.

    \b
    From the model (no daemon needed), per process holding the whole model:
      weights          params x bytes per value (fp32 4, fp16/bf16 2, fp8/int8 1, int4 0.5)
      gradients        the weights again (training only)
      optimizer state  params x 4 bytes x moments kept in fp32
                       (SGD 0, SGD with momentum 1, Adam/AdamW 2)
      master weights   params x 4 bytes when training in fp16/bf16 (the fp32 copy
                       mixed precision keeps for the optimizer)
      activations      batch x per-sample (measure memory at two batch sizes: the
                       difference over the batch difference is the per-sample part)
      CUDA context     --context, once per process
    In fp32 that is 2x (SGD), 3x (momentum) or 4x (Adam) the weight memory; in bf16
    with AdamW, 16 bytes per parameter. --inference keeps weights, activations and
    the context only. Suggested --mem: the total plus 10 % (allocator slack), rounded
    up to a whole G.

    With --history -- COMMAND (asks the daemon): the highest peak of your latest
    successful runs of exactly COMMAND, plus 10 %, rounded up. `submit --mem auto`
    uses the same figure.

    \b
    Example:
      gpusched estimate --params 7B --dtype bf16 --optimizer adamw --batch 8 --per-sample 1.2G
      gpusched estimate --params 1.3B --dtype fp16 --inference
      gpusched estimate --history -- python train.py --epochs 5
    """
    # Imported here, not at the top: every other command would pay for them at start-up.
    from gpusched.cli.sizing import estimate as estimate_memory
    from gpusched.cli.sizing import parse_params
    from gpusched.core.hints import mem_option

    if history:
        if params is not None or not command:
            raise UsageError("--history takes a command and no --params: estimate --history -- CMD")
        _from_history(ctx, list(command), as_json)
        return
    if command:
        raise UsageError(f"unexpected argument {command[0]!r} (a command needs --history)")
    if params is None:
        raise UsageError("give --params (e.g. --params 7B), or --history -- COMMAND")
    result = estimate_memory(
        parse_params(params),
        dtype,
        None if inference else optimizer,
        batch=batch,
        per_sample_bytes=(
            None if per_sample is None else parse_size(per_sample, what="--per-sample")
        ),
        context_bytes=parse_size(context, what="--context"),
    )
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    mode = "inference" if result.optimizer is None else f"training with {optimizer}"
    click.echo(f"{params} parameters, {result.dtype} weights, {mode}")
    click.echo("  (GiB: 2^30 bytes, what --mem's G means; GB: 10^9 bytes, as cards are sold)")
    for part, size, how in result.rows():
        click.echo(f"  {part:<17}{gib(size):>10}  {how}")
    click.echo(f"  {'total':<17}{gib(result.total):>10}  = {result.total / 10**9:.1f} GB")
    click.echo(f"suggested: --mem {mem_option(result.suggested_mem)} (total + 10%, rounded up)")
    _check_cards(ctx, result.suggested_mem)


def gib(n_bytes: int) -> str:
    """A size in GiB with its unit spelled out: 14 GB of weights is "13.0 GiB"."""
    return f"{n_bytes / 2**30:.1f} GiB"


def _check_cards(ctx: click.Context, wanted: int) -> None:
    """Say whether a GPU of this server holds `wanted` bytes (asks the daemon, briefly);
    without a daemon, whether any GPU made does."""
    obj = ctx.find_root().obj or {}
    try:
        gpus = Client(obj.get("socket"), obj.get("config"), timeout_s=2.0).status().gpus
    except GpuschedError:
        gpus = []
    shard = "shard the model (FSDP, DeepSpeed ZeRO) or offload optimizer state, and estimate"
    if not gpus:
        if wanted > LARGEST_CARD_BYTES:
            click.echo(f"note: no single GPU holds this: {shard} per GPU")
        return
    largest = max(gpus, key=lambda gpu: gpu.total)
    where = f"GPU {largest.index} ({shown(largest.name)}, {gib(largest.total)})"
    if wanted > largest.total:
        click.echo(f"note: no GPU here holds this: the largest is {where}; {shard} per GPU")
    else:
        fits = sum(1 for gpu in gpus if gpu.total >= wanted)
        click.echo(f"here: {fits} of {len(gpus)} GPU(s) hold it (the largest: {where})")


def _from_history(ctx: click.Context, command: list[str], as_json: bool) -> None:
    from gpusched.core.hints import mem_option, suggest_mem

    obj = ctx.find_root().obj or {}
    info = Client(obj.get("socket"), obj.get("config")).estimate_history(command)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    runs = info["jobs"]
    click.echo(
        f"peak {format_size(info['peak_mem'], tabular=False)}"
        f" over {len(runs)} earlier run(s) of this command"
        f" (job {', '.join(str(run['id']) for run in runs)})"
    )
    suggested = int(info["suggested_mem"])
    how = "peak + 10%, rounded up"
    if suggested < suggest_mem(int(info["peak_mem"])):
        how = "the most a GPU here gives: peak + 10% would not fit"
    click.echo(f"suggested: --mem {mem_option(suggested)} ({how})")
