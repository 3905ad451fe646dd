"""What the last pass read and said, kept for `status` between passes: the GPUs, what each
running job holds on them, and why each queued job waits. Rebuilt by every pass (its
publish phase); never a second copy of the truth, which is the store's and the probe's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusched.core.models import GpuState
from gpusched.scheduling.context import Context
from gpusched.scheduling.observe import read_gpus


@dataclass(frozen=True)
class Reading:
    gpus: list[GpuState] = field(default_factory=list)
    usage: dict[int, dict[str, int]] = field(default_factory=dict)  # job id -> uuid -> bytes
    waiting_reasons: dict[int, str] = field(default_factory=dict)
    jobs_pids: dict[str, frozenset[int]] = field(default_factory=dict)  # Observation's
    seen_pids: frozenset[int] = frozenset()  # Observation's


class LatestReading:
    def __init__(self, context: Context) -> None:
        self._context = context
        self.latest = Reading()

    def read_gpus(self) -> list[GpuState]:
        """The GPUs read now (the last reading marks them lost if the probe fails)."""
        return read_gpus(self._context.probe, self._context.config, self.latest.gpus)

    def gpus(self) -> list[GpuState]:
        """The last pass's reading, or one now before the first pass."""
        return self.latest.gpus or self.read_gpus()
