"""The plain state one plan works on, and what stays the same for the whole plan.

`PlanState` holds what the plan changes as it goes (beside its `Settings`, module
settings): the cards (`PlanGpu`, their room
taken by each placement), the room (the open cards no claim keeps, most available
first, kept sorted), the head's claim (`kept`), the cards kept for a job held for a
quieter card (`quiet_kept`), what the caps count, the waiting reasons, and the
placements. The steps that change it are functions in modules candidates, placing and
consider; nothing here is a closure over shared locals. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpusched.scheduling.policy.budget import GpuBudget, PlanGpu, RunningClaim
from gpusched.scheduling.policy.caps import Tallies
from gpusched.scheduling.policy.card_limits import is_open
from gpusched.scheduling.policy.contention import CalmRoom
from gpusched.scheduling.policy.data import Placement, Plan, WaitingJob
from gpusched.scheduling.policy.head_claim import Kept
from gpusched.scheduling.policy.host import HostTally
from gpusched.scheduling.policy.keep_for_bigger import Needs
from gpusched.scheduling.policy.reasons import WaitingReasons
from gpusched.scheduling.policy.settings import Settings
from gpusched.scheduling.policy.turns import PassedOn


@dataclass(slots=True)
class PlanState:
    settings: Settings
    budgets: dict[str, GpuBudget]  # before this plan's placements: what the plan answers
    gpus: list[PlanGpu]
    by_uuid: dict[str, PlanGpu]
    tallies: Tallies
    needs: Needs
    reasons: WaitingReasons = field(default_factory=WaitingReasons)
    passed_on: PassedOn = field(default_factory=PassedOn)
    placements: list[Placement] = field(default_factory=list)
    kept: Kept | None = None  # the head's claim in this plan
    quiet_kept: dict[str, int] = field(default_factory=dict)  # uuid -> the job held for quiet
    room: list[PlanGpu] | None = None  # open unclaimed cards, most available first
    calm: CalmRoom = field(default_factory=CalmRoom)  # the room's calm cards, per change
    # A job with a --time runs or was placed (module time_limits: else a job with none
    # is not checked against it).
    timed: bool = False
    # What the running and placed jobs reserve of each server (the host rule).
    host: HostTally = field(default_factory=lambda: HostTally({}, {}))

    @classmethod
    def start(
        cls,
        table: Mapping[str, tuple[GpuBudget, PlanGpu]],
        running: Sequence[RunningClaim],
        waiting: Sequence[WaitingJob],
        settings: Settings,
    ) -> PlanState:
        """The state before the first job: the cards as budgeted, the running jobs'
        tallies, the waiting jobs' sizes."""
        gpus = [gpu for _, gpu in table.values()]
        by_uuid = {gpu.slot.uuid: gpu for gpu in gpus}
        budgets = {uuid: budget for uuid, (budget, _) in table.items()}
        state = cls(
            settings, budgets, gpus, by_uuid, Tallies.of(running, by_uuid), Needs(waiting, gpus)
        )
        state.timed = any(claim.ends_in_s is not None for claim in running)
        state.host = HostTally.of(
            [
                (_node_of(claim.gpu_uuids, by_uuid), claim.ram_bytes, claim.cpus)
                for claim in running
                if claim.ram_bytes or claim.cpus
            ]
        )
        return state

    def node_of(self, gpus: Sequence[PlanGpu]) -> str:
        """The server these cards are on (a job's cards are all on one)."""
        return gpus[0].slot.node if gpus else ""

    def unclaimed(self, gpu: PlanGpu) -> bool:
        """Kept neither for the head nor for a job held for a quieter card."""
        kept = self.kept
        return (
            kept is None or gpu.slot.uuid not in kept.cards
        ) and gpu.slot.uuid not in self.quiet_kept

    def is_open(self, gpu: PlanGpu) -> bool:
        return is_open(gpu, self.settings.max_jobs_per_gpu, self.settings.busy_util)

    def claims_changed(self) -> None:
        """A claim took cards out of the room: rebuild it, and forget remembered answers."""
        self.room = None
        self.reasons.forget()

    def result(self) -> Plan:
        kept = self.kept
        return Plan(
            self.placements,
            self.reasons.said,
            self.budgets,
            kept.claim if kept is not None else None,
            frozenset(self.reasons.held_for_quieter),
        )


def _node_of(uuids: Sequence[str], by_uuid: Mapping[str, PlanGpu]) -> str:
    """The server a running job's cards are on ("" where none is known)."""
    for uuid in uuids:
        if uuid in by_uuid:
            return by_uuid[uuid].slot.node
    return ""
