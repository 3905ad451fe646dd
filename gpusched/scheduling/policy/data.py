"""The policy's plain data: what a waiting job asks of `plan()` (WaitingJob), a user's
share of the server (UserCap), the cards kept for a blocked head between plans
(HeadClaim), and what a plan answers (Placement, Plan).

Every rule module reads these and none of them defines one, so the rules import the data
and never each other's home; the package re-exports them for the placers, benchmarks and
tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusched.scheduling.policy.budget import GpuBudget

# A waiting job's ask, as `plan()` memoises answers by: see WaitingJob.ask.
Ask = tuple[int | None, int, frozenset[str] | None, bool, float | None]


@dataclass(frozen=True)
class WaitingJob:
    """A job that may start now (held jobs and unmet dependencies are filtered out before)."""

    job_id: int
    mem_bytes: int | None  # per GPU; None = a whole GPU
    gpu_count: int = 1
    priority: int = 0
    user: str = ""
    array_id: int | None = None
    array_cap: int | None = None  # --max-concurrent of its array
    queue_order: int | None = (
        None  # its place in submit order; None: job_id (see turns.submit_place)
    )
    gpu_keys: frozenset[str] | None = None  # the GPUs (slot uuids) it may use; None: any
    demand: float | None = None  # share of a card's busy time it needs, 0.0-1.0; None: unknown
    # >0: `demand` is not its own history but its owner's latest this many ended runs',
    # all busy (gpusched.usage.demand_history.owner_prior)
    owner_runs: int = 0
    exclusive: bool = False  # --exclusive: a card to itself
    # --share: its owner says it is light; what was measured of its kind outranks that
    # (`light_by_word`)
    share: bool = False
    time_limit_s: float | None = None  # --time: it ends by then (time backfill)
    waited_s: float = 0.0  # how long rule 3 has held it for a quieter card (its reason)
    top: int | None = None  # put first by an administrator (`gpusched top`): lower first
    ram_bytes: int | None = None  # --ram: host memory it reserves (the host rule)
    cpus: int | None = None  # --cpus: cores it reserves
    # What `plan()` memoises its answers by (memory, cards, cards allowed, --exclusive,
    # --time): built with the view, which a placer keeps across passes, not per pass.
    ask: Ask = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.share and self.owner_runs:
            # Its owner's other runs say nothing of one its owner says is light: only what
            # was measured of its own kind outranks `--share`.
            object.__setattr__(self, "demand", None)
            object.__setattr__(self, "owner_runs", 0)
        ask = (self.mem_bytes, self.gpu_count, self.gpu_keys, self.exclusive, self.time_limit_s)
        object.__setattr__(self, "ask", ask)

    @property
    def light_by_word(self) -> bool:
        """Light because its owner said `--share` and nothing measured says otherwise."""
        return self.share and self.demand is None


@dataclass(frozen=True)
class HeadClaim:
    """The cards kept for a blocked head job (stored between plans by the scheduler)."""

    job_id: int
    gpu_uuids: tuple[str, ...]
    mem_bytes: int | None  # the head's declaration per GPU; None: a whole GPU


@dataclass(frozen=True)
class UserCap:
    """A user's share of the server (None: no limit)."""

    max_running: int | None = None
    max_mem_bytes: int | None = None  # declared GPU memory in use, summed over GPUs


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    placements: list[Placement]
    waiting_reasons: dict[int, str]
    budgets: dict[str, GpuBudget]
    head_claim: HeadClaim | None = None  # the cards kept for the blocked head: store it
    # The jobs rule 3 held for a quieter card in this plan: the placer notes when each
    # was first held, and says how long it has waited since (`waited_s`).
    quieter: frozenset[int] = frozenset()
