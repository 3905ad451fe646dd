"""The mission's rule: among the cards left, the most available memory first.

`placement: most-free` (the default) takes the card with the most memory available once
every running job's declared need is counted; `placement: best-fit` the least that still
fits, which packs small jobs tighter and leaves whole cards for big ones. Ties go to the
lower index. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.scheduling.policy.budget import PlanGpu

PLACEMENTS = ("most-free", "best-fit")


def in_placement_order(cards: list[PlanGpu], placement: str, ordered: bool) -> None:
    """Sort `cards` in place by `placement`; `ordered`: they come most-free first already
    (the plan's room is kept sorted so), which spares a sort per placement in a long pass."""
    if placement == "best-fit":
        cards.sort(key=lambda g: (g.available, g.slot.index))
    elif not ordered:
        cards.sort(key=lambda g: (-g.available, g.slot.index))


def most_available(gpus: Sequence[PlanGpu]) -> PlanGpu:
    """The card with the most available memory (ties to the lower index)."""
    return min(gpus, key=lambda g: (-g.available, g.slot.index))
