"""What one plan is asked under, fixed from its first job to its last (`Settings`).

Pure data: the caps, the limits, the stored head claim and the rules' options that
`plan()` was called with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpusched.scheduling.policy.data import HeadClaim, UserCap
from gpusched.scheduling.policy.host import HostRoom
from gpusched.scheduling.policy.topology import Topology


@dataclass(frozen=True)
class Settings:
    """What one plan is asked under: the same from its first job to its last."""

    max_jobs_per_gpu: int | None
    busy_util: float | None
    placement: str
    pack: str
    topology: Topology | None
    caps: Mapping[str, UserCap]
    stored_claim: HeadClaim | None  # the head's claim of the last plan, to keep
    several_nodes: bool  # a card's name in a reason says its node
    # Each server's room for --ram and --cpus, by node name (the host rule); none: no
    # job waits for host memory or cores.
    hosts: Mapping[str, HostRoom] = field(default_factory=dict)
