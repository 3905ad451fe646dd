"""GPU probes: what the GPUs hold right now, read from NVML or simulated.

A probe answers one question, `snapshot()`: the list of GPUs with their memory,
utilization and the processes holding memory on them. It knows nothing about jobs
beyond `note_job_started()`, which only the simulated probe uses (to make a running
job "allocate" what it declared, as a real job would, and keep its card as busy as its
environment's GPUSCHED_SIM_UTIL says, else as the probe's default).

The NVML probe lives in `gpusched.gpus.nvml` so that importing this module never loads pynvml.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import psutil

from gpusched.core.models import GpuHealth, GpuProcess, GpuState

# The config validates `simulate:` with it; it lives with the other parsers of sizes.
from gpusched.core.units import LIGHT_UTIL, format_size, parse_simulate_spec


class Probe(Protocol):
    """What the daemon needs from the hardware."""

    def snapshot(self) -> list[GpuState]:
        """Read every GPU now. Raises GpuError only when no GPU can be read at all."""
        ...

    def note_job_started(
        self,
        pid: int,
        gpu_uuids: Sequence[str],
        mem_bytes: int | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Tell the probe a job's process tree now runs on these GPUs (`env`: the job's
        environment, where known)."""
        ...

    def describe(self) -> str:
        """One line for the daemon's log: what GPUs this probe reads and how."""
        ...

    def close(self) -> None: ...


# A job's environment variable that sets how busy it reads (0-100) on simulated GPUs.
SIM_UTIL_ENV = "GPUSCHED_SIM_UTIL"


def simulated_util(env: Mapping[str, str] | None, default: int) -> int:
    """A simulated job's utilization: its GPUSCHED_SIM_UTIL when that is a whole number
    from 0 to 100, else `default` (a try-out's typo must not fail the job)."""
    text = (env or {}).get(SIM_UTIL_ENV, "").strip().removesuffix("%")
    if text.isdigit() and int(text) <= 100:
        return int(text)
    return default


@dataclass
class _SimulatedAllocation:
    pid: int
    create_time: float
    gpu_uuids: tuple[str, ...]
    mem_bytes: int
    util_percent: int


class SimulatedProbe:
    """GPUs that exist only in memory: a running job uses exactly what it declared.

    A job without a declared size (a whole GPU) is simulated as using nothing, so
    its card shows as reserved rather than used. A job keeps its cards `util_percent`
    busy (its GPUSCHED_SIM_UTIL overrides it); a card reads the sum of its jobs', at most
    100 %, and no figure per process, as a driver that samples only whole cards.
    Topology: cards 0-1, 2-3, ... each share a PCIe switch (NVML level 10); the pairs
    meet at the host bridge (30).
    """

    def __init__(self, sizes: Sequence[int], util_percent: int = LIGHT_UTIL) -> None:
        self._util_percent = util_percent
        self._gpus = [
            GpuState(
                index=i,
                uuid=f"GPU-5a5a5a5a-0000-4000-8000-{i:012d}",
                name="Simulated GPU",
                total_bytes=size,
                used_bytes=0,
                free_bytes=size,
                util_percent=0,
            )
            for i, size in enumerate(sizes)
        ]
        self._allocations: list[_SimulatedAllocation] = []
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str, util_percent: int = LIGHT_UTIL) -> SimulatedProbe:
        return cls(parse_simulate_spec(spec), util_percent)

    def describe(self) -> str:
        sizes = ", ".join(format_size(g.total_bytes, tabular=False) for g in self._gpus)
        return (
            f"{len(self._gpus)} simulated GPU(s): {sizes};"
            f" a job reads {self._util_percent} % busy unless its {SIM_UTIL_ENV} says otherwise"
        )

    def note_job_started(
        self,
        pid: int,
        gpu_uuids: Sequence[str],
        mem_bytes: int | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not mem_bytes:
            return
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        with self._lock:
            self._allocations.append(
                _SimulatedAllocation(
                    pid,
                    create_time,
                    tuple(gpu_uuids),
                    mem_bytes,
                    simulated_util(env, self._util_percent),
                )
            )

    def _alive(self, allocation: _SimulatedAllocation) -> bool:
        # Compare start times so that a reused pid does not keep a dead job's memory.
        try:
            process = psutil.Process(allocation.pid)
            return (
                process.create_time() == allocation.create_time
                and process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def snapshot(self) -> list[GpuState]:
        with self._lock:
            self._allocations = [a for a in self._allocations if self._alive(a)]
            allocations = list(self._allocations)
        states = []
        for gpu in self._gpus:
            on_gpu = [a for a in allocations if gpu.uuid in a.gpu_uuids]
            procs = tuple(GpuProcess(a.pid, a.mem_bytes) for a in on_gpu)
            used = min(gpu.total_bytes, sum(p.used_bytes or 0 for p in procs))
            states.append(
                replace(
                    gpu,
                    used_bytes=used,
                    free_bytes=gpu.total_bytes - used,
                    util_percent=min(100, sum(a.util_percent for a in on_gpu)),
                    processes=procs,
                )
            )
        return states

    def topology(self) -> dict[str, dict[str, int]]:
        """As NvmlProbe.topology: common-ancestor levels by uuid (see the class)."""
        return {
            a.uuid: {
                b.uuid: 10 if a.index // 2 == b.index // 2 else 30 for b in self._gpus if b is not a
            }
            for a in self._gpus
        }

    def device_minors(self) -> dict[str, int]:
        """As NvmlProbe.device_minors: none, since simulated cards have no device node,
        so a job on them is fenced from no card."""
        return {}

    def close(self) -> None:
        pass


def apply_selection(
    states: list[GpuState], selection: Sequence[int | str] | None
) -> list[GpuState]:
    """Mark GPUs outside the config's `gpus:` list as excluded (kept so status shows them)."""
    if selection is None:
        return states
    wanted = {str(item) for item in selection}
    return [
        gpu
        if str(gpu.index) in wanted or gpu.uuid in wanted
        else replace(gpu, health=GpuHealth.EXCLUDED)
        for gpu in states
    ]
