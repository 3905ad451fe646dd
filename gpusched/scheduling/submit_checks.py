"""Whether a submitted job could ever run: enough GPUs on one server, and a GPU with room
for its --mem. On one server, its GPUs; in a cluster, every live node's as reported
(a job's GPUs are all on one node). Pure: the caller passes the GPUs it knows of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpusched.core.errors import ConflictError, UsageError
from gpusched.core.models import GpuHealth, GpuState
from gpusched.core.units import format_size
from gpusched.scheduling.policy_inputs import capacity_bytes
from gpusched.store import NewJob


def check_fits(
    new: NewJob, gpus_by_node: Mapping[str, Sequence[GpuState]], headroom_bytes: int
) -> None:
    """Raise (one line) if `new` could run on none of these GPUs, even when all are free."""
    by_node = {
        name: [g for g in gpus if g.health != GpuHealth.EXCLUDED]
        for name, gpus in gpus_by_node.items()
    }
    every = [g for gpus in by_node.values() for g in gpus]
    if not every:
        raise ConflictError("this daemon has no GPUs to run jobs on")
    if new.allowed_nodes:
        by_node = {name: gpus for name, gpus in by_node.items() if name in new.allowed_nodes}
        if not by_node:
            raise UsageError(
                f"--node {','.join(new.allowed_nodes)}: no such node up in this cluster"
                f" (nodes: {', '.join(sorted(gpus_by_node))})"
            )
        every = [g for gpus in by_node.values() for g in gpus]
    most_gpus = max(len(gpus) for gpus in by_node.values())
    if new.gpus > most_gpus:
        where = "this server has" if len(gpus_by_node) == 1 else "the largest node has"
        raise UsageError(f"--gpus {new.gpus}: {where} only {most_gpus} GPU(s)")
    if new.mem is not None:
        largest = max(every, key=lambda g: (capacity_bytes(g), -g.index))
        most = capacity_bytes(largest) - headroom_bytes
        if new.mem > most:
            raise UsageError(
                f"--mem {format_size(new.mem)} is more than any GPU can give: the largest is"
                f" GPU {largest.index} ({largest.name}) with {format_size(largest.total_bytes)}"
                f" total, {format_size(most)} usable by jobs"
            )
