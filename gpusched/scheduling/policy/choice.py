"""Which of the cards a job fits on now it gets: the card rules after the head's claim.

The plan hands over the cards a job could start on now (its memory fits, the card is
open to it, and no claim forbids it); each rule below narrows the choice only while
enough cards are left for the job, in this order:

1. keep_for_bigger: not the only cards a waiting larger job could use; under contention,
   unless none of the cards left would take the job quietly (contention's `quiet`): then
   the quiet cards it kept go to the job where every larger waiting job that could use
   them still fits beside it (so it delays none of them), else it takes the cards left
   to it, as before (`_quiet_over_big`);
2. contention (`pack: contention`): quiet cards first, busy jobs apart;
3. most_free: the most available memory first (`placement: most-free`), or the least that
   fits (`placement: best-fit`);
4. topology: a multi-GPU job's tightest set, taken in that order.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.contention import prefer_quiet, quiet
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
        if len(cards) < len(candidates):
            cards = _quiet_over_big(job, candidates, cards, needs, count)
        cards = prefer_quiet(job, cards, count)
    in_placement_order(cards, placement, ordered)
    if count == 1:
        return cards[:1]
    return tightest(cards, count, topology)


def _quiet_over_big(
    job: WaitingJob,
    candidates: Sequence[PlanGpu],
    left: list[PlanGpu],
    needs: Needs,
    count: int,
) -> list[PlanGpu]:
    """`left` (rule 1's narrowing of `candidates`), unless too few of them take `job`
    quietly: then with the quiet cards rule 1 kept where every larger waiting job that
    could use them still fits beside it, if that makes enough."""
    calm = [g for g in left if quiet(job, g)]
    if len(calm) >= count:
        return left
    kept = {id(g) for g in left}
    # In the candidates' order: the most-free order is kept for rule 3.
    taken = [
        g
        for g in candidates
        if quiet(job, g) and (id(g) in kept or needs.leaves_room(job.mem_bytes, g))
    ]
    return taken if len(taken) >= count else left
