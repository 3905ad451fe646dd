"""Which of the cards a job fits on now it gets: the card rules after the head's claim.

The plan hands over the cards a job could start on now (its memory fits, the card is
open to it, and no claim forbids it); each rule below narrows the choice only while
enough cards are left for the job, in this order:

1. keep_for_bigger: not the only cards a waiting larger job could use;
2. contention (`pack: contention`): quiet cards first, busy jobs apart;
3. most_free: the most available memory first (`placement: most-free`), or the least that
   fits (`placement: best-fit`);
4. topology: a multi-GPU job's tightest set, taken in that order.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.contention import prefer_quiet
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.keep_for_bigger import Needs, keep_big_cards
from gpusched.scheduling.policy.most_free import in_placement_order
from gpusched.scheduling.policy.topology import Topology, tightest


def choose_gpus(
    job: WaitingJob,
    candidates: Sequence[PlanGpu],
    needs: Needs,
    *,
    placement: str = "most-free",
    pack: str = "contention",
    topology: Topology | None = None,
    ordered: bool = False,
) -> list[PlanGpu] | None:
    """The GPUs `job` starts on among `candidates` (each fits it now); None: too few.

    `ordered`: the candidates come in the most-free order already (the plan's room is
    kept sorted so), which spares a sort per placement in a long pass."""
    count = job.gpu_count
    if len(candidates) < count:
        return None
    cards = keep_big_cards(job, list(candidates), needs, count)
    if pack == "contention":
        cards = prefer_quiet(job, cards, count)
    in_placement_order(cards, placement, ordered)
    if count == 1:
        return cards[:1]
    return tightest(cards, count, topology)
