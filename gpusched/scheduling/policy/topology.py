"""A multi-GPU job's set: the cards that sit closest together, on one node.

Closeness is NVML's common-ancestor level between two cards
(`nvmlDeviceGetTopologyCommonAncestor`: 0 the same board ... 50 across CPU sockets);
cards with no reading count as the farthest, and cards on different nodes never mix.
Among equally tight sets the one whose worst card comes first in the most-free order
wins, so with no readings the choice is that order's prefix. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpusched.scheduling.policy.budget import PlanGpu

# NVML's common-ancestor levels (0 the same board ... 50 across CPU sockets); cards with no
# reading count as the farthest.
UNKNOWN_LEVEL = 60

Topology = Mapping[str, Mapping[str, int]]  # uuid -> uuid -> common ancestor level


def _level(topology: Topology | None, a: PlanGpu, b: PlanGpu) -> int:
    if topology is None:
        return UNKNOWN_LEVEL
    return topology.get(a.slot.uuid, {}).get(b.slot.uuid, UNKNOWN_LEVEL)


def tightest(cards: list[PlanGpu], count: int, topology: Topology | None) -> list[PlanGpu] | None:
    """Of `cards` (in the most-free order), the `count` on one node that sit closest
    together; among equally tight sets, the one whose worst card comes first in that order
    (as a prefix of that order would be), then the one whose best card does."""
    rank = {id(g): i for i, g in enumerate(cards)}
    best: list[PlanGpu] | None = None
    best_score = (UNKNOWN_LEVEL + 1, 0, 0)
    for anchor in cards:
        others = sorted(
            (
                (_level(topology, anchor, other), rank[id(other)], other)
                for other in cards
                if other is not anchor and other.slot.node == anchor.slot.node
            ),
            key=lambda t: (t[0], t[1]),
        )
        if len(others) < count - 1:
            continue
        chosen = sorted(
            [anchor, *(o for _, _, o in others[: count - 1])], key=lambda g: rank[id(g)]
        )
        tightness = max(
            _level(topology, a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]
        )
        score = (tightness, rank[id(chosen[-1])], rank[id(chosen[0])])
        if best is None or score < best_score:
            best, best_score = chosen, score
        if topology is None:
            break  # no reading: the most-free order alone
    return best
