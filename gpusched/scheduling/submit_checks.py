"""Whether a submitted job could ever run: enough GPUs on one server, and `--gpus N` cards
on one server each with room for its --mem. On one server, its GPUs; in a cluster, every
live node's as reported (a job's GPUs are all on one node). A node that has joined but
not yet reported its cards could be the one that fits: while one such could run the job,
nothing is refused on size, and the job waits for the node's report. Pure: the caller
passes the GPUs it knows of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpusched.core.errors import ConflictError, UsageError
from gpusched.core.models import GpuHealth, GpuState
from gpusched.core.units import format_size
from gpusched.scheduling.policy_inputs import capacity_bytes
from gpusched.store import NewJob


def check_fits(
    new: NewJob, gpus_by_node: Mapping[str, Sequence[GpuState] | None], headroom_bytes: int
) -> None:
    """Raise (one line) if `new` could run on none of these GPUs, even when all are free
    (None: a node whose GPUs are not known yet)."""
    if new.allowed_nodes:
        candidates = {n: g for n, g in gpus_by_node.items() if n in new.allowed_nodes}
        if not candidates:
            raise UsageError(
                f"--node {','.join(new.allowed_nodes)}: no such node up in this cluster"
                f" (nodes: {', '.join(sorted(gpus_by_node))})"
            )
    else:
        candidates = dict(gpus_by_node)
    if any(gpus is None for gpus in candidates.values()):
        return
    by_node = {
        name: [g for g in gpus or () if g.health != GpuHealth.EXCLUDED]
        for name, gpus in candidates.items()
    }
    every = [g for gpus in by_node.values() for g in gpus]
    if not every and not new.allowed_nodes:
        raise ConflictError("this daemon has no GPUs to run jobs on")
    most_gpus = max(len(gpus) for gpus in by_node.values())
    if new.gpus > most_gpus:
        where = "this server has" if len(gpus_by_node) == 1 else "the largest node has"
        if len(gpus_by_node) > 1 and len(by_node) == 1:
            where = f"node {next(iter(by_node))} has"
        raise UsageError(f"--gpus {new.gpus}: {where} only {most_gpus} GPU(s)")
    if new.mem is not None and every:
        largest = max(every, key=lambda g: (capacity_bytes(g), -g.index))
        most = capacity_bytes(largest) - headroom_bytes
        if new.mem > most:
            raise UsageError(
                f"--mem {format_size(new.mem)} is more than any GPU can give: the largest is"
                f" GPU {largest.index} ({largest.name}) with {format_size(largest.total_bytes)}"
                f" total, {format_size(most)} usable by jobs"
            )
    if new.mem is not None and new.gpus > 1:
        _check_enough_cards(new.mem, new.gpus, by_node, headroom_bytes)


def _check_enough_cards(
    mem: int, count: int, by_node: Mapping[str, Sequence[GpuState]], headroom_bytes: int
) -> None:
    """`--gpus N --mem M`: N cards of one server must each be able to hold M."""
    able = {
        name: [g for g in gpus if capacity_bytes(g) - headroom_bytes >= mem]
        for name, gpus in by_node.items()
    }
    most = max(len(cards) for cards in able.values())
    if most >= count:
        return
    cards = max(able.values(), key=len)
    which = ", ".join(f"GPU {g.index} ({format_size(g.total_bytes, tabular=False)})" for g in cards)
    where = "this server" if len(by_node) == 1 else "any node"
    raise UsageError(
        f"--mem {format_size(mem, tabular=False)} --gpus {count}: only {most} GPU(s) of {where}"
        f" can hold {format_size(mem, tabular=False)}{f' ({which})' if which else ''};"
        f" ask for fewer GPUs or less memory per GPU"
    )


def most_per_gpu(
    gpus_by_node: Mapping[str, Sequence[GpuState] | None], headroom_bytes: int
) -> int | None:
    """The largest --mem any known GPU could give a job (whole MiB), None if none known."""
    known = [
        capacity_bytes(g) - headroom_bytes
        for gpus in gpus_by_node.values()
        for g in gpus or ()
        if g.health != GpuHealth.EXCLUDED
    ]
    return max(known) // 2**20 * 2**20 if known else None
