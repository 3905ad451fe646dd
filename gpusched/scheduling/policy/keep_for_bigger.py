"""Big cards for big jobs: a job does not take the only cards a waiting larger job fits.

Among the cards a job could start on, it prefers those that fewer of the jobs still
waiting with a larger `--mem` could ever use (`Needs.served`): on cards 24G, 24G, 80G,
80G two 20G jobs take the 24G cards and a `--gpus 2 --mem 70G` job the 80G pair. The
rule narrows the choice only while enough cards are left, and says nothing when the cards
cannot be told apart (every usable card could hold the same). Under contention a card
it would keep may still go to a job that no card left to it takes quietly, where every
larger waiting job that could use the card still fits beside it (`Needs.leaves_room`:
module choice). Pure.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter

from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import WaitingJob

_mem = attrgetter("mem_bytes")


class Needs:
    """The per-GPU memory of the jobs still waiting in a plan, sorted."""

    def __init__(self, waiting: Sequence[WaitingJob], gpus: Sequence[PlanGpu]) -> None:
        self._waiting = waiting
        self._sorted: list[int] | None = None  # sorted when first asked (`_sizes`)
        self._placed: list[int] = []  # removed before then
        # Cards that could all ever hold the same: the rule cannot tell them apart.
        self.uniform = len({g.potential for g in gpus if g.slot.usable}) <= 1

    @property
    def _sizes(self) -> list[int]:
        # Sorted only when the rule asks (never while the cards are uniform): a long
        # queue's sort is a plan's largest single step.
        if self._sorted is None:
            self._sorted = sorted([m for m in map(_mem, self._waiting) if m is not None])
            for mem_bytes in self._placed:
                self._drop(mem_bytes)
        return self._sorted

    @property
    def count(self) -> int:
        return len(self._sizes)

    def remove(self, mem_bytes: int | None) -> None:
        if mem_bytes is None:
            return
        if self._sorted is None:
            self._placed.append(mem_bytes)
        else:
            self._drop(mem_bytes)

    def _drop(self, mem_bytes: int) -> None:
        sizes = self._sizes
        at = bisect.bisect_left(sizes, mem_bytes)
        if at < len(sizes) and sizes[at] == mem_bytes:
            del sizes[at]

    def larger(self, mem_bytes: int | None) -> int:
        """Where the sizes larger than `mem_bytes` start (len: none is larger)."""
        if mem_bytes is None:
            return len(self._sizes)
        return bisect.bisect_right(self._sizes, mem_bytes)

    def leaves_room(self, mem_bytes: int | None, gpu: PlanGpu) -> bool:
        """Whether every waiting job larger than `mem_bytes` that could ever use `gpu`
        would still fit there beside a job of `mem_bytes` (once the others there end)."""
        if mem_bytes is None:
            return False
        sizes = self._sizes
        start, top = self.larger(mem_bytes), bisect.bisect_right(sizes, gpu.potential)
        return top <= start or gpu.potential - mem_bytes >= sizes[top - 1]

    def served(self, start: int, gpu: PlanGpu) -> int:
        """How many waiting jobs larger (from `start`, see `larger`) could ever fit here."""
        return max(0, bisect.bisect_right(self._sizes, gpu.potential) - start)


def keep_big_cards(
    job: WaitingJob, cards: list[PlanGpu], needs: Needs, count: int
) -> list[PlanGpu]:
    """Of `cards` (at least `count`), those that the fewest larger waiting jobs could use."""
    start = None if needs.uniform else needs.larger(job.mem_bytes)
    if start is None or start >= needs.count:  # cards alike, or no larger job waits
        return cards
    served = {g.slot.uuid: needs.served(start, g) for g in cards}
    if len(set(served.values())) <= 1:
        return cards
    least = sorted(served.values())[count - 1]
    return [g for g in cards if served[g.slot.uuid] <= least]
