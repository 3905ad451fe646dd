"""The host rule: a job's `--ram` and `--cpus` within what the server itself can give.

A server's capacity for jobs (`HostRoom`) is its memory less a reserve (a share of it,
at least a minimum) within the service's own memory limit, and its cores less a reserve
(`host_capacity`). A job that asks for host memory or cores reserves them while it runs;
one whose ask the server has not free now waits, with a reason that says how much is
free of how much ("waits for host memory: 20G of 60G free, needs 24G"), and claims no
card (as a job its owner's cap holds back); one that could never fit is refused at
submit (`never_fits`). A job that gives neither reserves nothing: it is capped at its
GPUs' equal share of the capacity (`default_share`), as packing more jobs than GPUs on
the cards stays as it was. In a cluster, each node's room is its own. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.units import format_size


@dataclass(frozen=True)
class HostRoom:
    """What a server can give its jobs in all (None: not known, or not enforced there)."""

    ram_bytes: int | None = None
    cpus: int | None = None


def host_capacity(
    total_bytes: int,
    service_bytes: int | None,
    cores: int,
    *,
    reserve_fraction: float,
    reserve_bytes: int,
    reserve_min_bytes: int,
    cpu_reserve: int,
) -> HostRoom:
    """The capacity of a server of `total_bytes` of memory (`service_bytes`: what the
    service's own memory limit leaves its jobs, if any) and `cores` cores: the memory
    less its reserve (a fraction or a size, at least `reserve_min_bytes`, never all of
    it), the cores less `cpu_reserve` (at least one)."""
    reserve = max(int(total_bytes * reserve_fraction), reserve_bytes, reserve_min_bytes)
    ram = max(total_bytes - reserve, total_bytes // 10)
    if service_bytes is not None:
        ram = min(ram, service_bytes)
    return HostRoom(max(ram, 1), max(1, cores - cpu_reserve))


def default_share(capacity: int, gpu_count: int, job_gpus: int, per_gpu: int | None) -> int:
    """What a job of `job_gpus` GPUs gets when it asks for none: `per_gpu` (configured)
    times its GPUs, else its GPUs' equal share of `capacity` (capacity / GPUs each),
    never more than `capacity`, never less than one (a core) or a byte."""
    gpus = max(1, gpu_count)
    taken = min(max(1, job_gpus), gpus)
    share = per_gpu * taken if per_gpu is not None else capacity * taken // gpus
    return max(1, min(share, capacity))


def never_fits(ram: int | None, cpus: int | None, room: HostRoom, where: str) -> str | None:
    """Why a job asking for `ram` and `cpus` could never start on a server of `room`
    (`where`: its name in the words); None: it could, once the server's jobs end."""
    if ram is not None and room.ram_bytes is not None and ram > room.ram_bytes:
        return (
            f"--ram {format_size(ram, tabular=False)} is more than {where} gives its jobs"
            f" ({format_size(room.ram_bytes, tabular=False)} of host memory)"
        )
    if cpus is not None and room.cpus is not None and cpus > room.cpus:
        return f"--cpus {cpus} is more than {where} gives its jobs ({room.cpus} cores)"
    return None


@dataclass
class HostTally:
    """What the running and placed jobs reserve of each server, as a plan goes."""

    ram_bytes: dict[str, int]
    cpus: dict[str, int]

    @classmethod
    def of(cls, reserved: Sequence[tuple[str, int | None, int | None]]) -> HostTally:
        """(node, --ram, --cpus) of each running job."""
        tally = cls({}, {})
        for node, ram, cpus in reserved:
            tally.take(node, ram, cpus)
        return tally

    def take(self, node: str, ram: int | None, cpus: int | None) -> None:
        if ram:
            self.ram_bytes[node] = self.ram_bytes.get(node, 0) + ram
        if cpus:
            self.cpus[node] = self.cpus.get(node, 0) + cpus


def host_wait(
    ram: int | None,
    cpus: int | None,
    node: str,
    rooms: Mapping[str, HostRoom],
    tally: HostTally,
) -> str | None:
    """Why a job asking for `ram` and `cpus` cannot start on `node` now; None: it can
    (or the node's room is not known)."""
    room = rooms.get(node)
    if room is None:
        return None
    if ram and room.ram_bytes is not None:
        free = max(0, room.ram_bytes - tally.ram_bytes.get(node, 0))
        if ram > free:
            return (
                f"waits for host memory: {format_size(free, tabular=False)} of"
                f" {format_size(room.ram_bytes, tabular=False)} free, needs"
                f" {format_size(ram, tabular=False)}"
            )
    if cpus and room.cpus is not None:
        free_cpus = max(0, room.cpus - tally.cpus.get(node, 0))
        if cpus > free_cpus:
            return f"waits for cores: {free_cpus} of {room.cpus} free, needs {cpus}"
    return None
