"""The packing benchmark's policies, each a way of calling gpusched's own `plan()`.

  default            `pack: contention` (issue 25: busy jobs apart), `placement: most-free`
  pack: memory       memory alone decides, as gpusched did before issue 25
  best fit           `placement: best-fit` (the tightest card that fits), pack as by default
  one job per GPU    every job a whole-GPU job (no --mem): task-spooler -G, gflow's default
  strict contention  a what-if beside them, no gpusched option: EVERY job (light, busy or
                     with no history) waits for cards its demand keeps at or under 100 %

`plan()` gains `pack=`/`placement=` keyword arguments and a per-job `demand` (0-1, None:
no history) on `WaitingJob` and `RunningClaim` in the policy branch. Where this checkout's
`plan()` has them they are passed as they are; where it lacks them the policy is
EMULATED around today's `plan()` by `emulated_keys()`, which restricts each waiting job
to the cards the missing rule would allow (`WaitingJob.gpu_keys`), and `place()` then
takes one placement per call so that each job sees the cards as the jobs placed before
it left them. Delete `emulated_keys()` and that loop once `plan()` has both arguments.

The emulated contention rule (issue 25, "Contention-aware placement"): among the cards
where a job fits now, prefer those whose jobs' demands plus its own stay at or under
100 %; failing that, a light job (demand under `BUSY_DEMAND`) or one with no history
takes the least loaded card that fits (it never waits for that reason alone), and a busy
job takes a card not already busy with another (load under `BUSY_DEMAND`), else waits
for a quieter card. The bound on that wait: the first job in the queue's order that waits
for a quieter card keeps the least loaded cards that fit it, and no job behind it starts
there, so it starts once enough of the jobs running there have ended (as rule 5 keeps
cards for the head that waits for memory). The emulation cannot see the cards that rule 5
keeps within `plan()`: a job restricted to such a card waits a pass longer than the real
rule would make it. A running job's demand is known once it has allocated (measured);
before that, only from its name's history.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields, replace
from typing import Any

from gpusched.scheduling.gpu_budget import GpuSlot, RunningClaim, gpu_budgets
from gpusched.scheduling.policy import Placement, WaitingJob, plan

BUSY_DEMAND = 0.5  # a job or card at or above this share of a card is busy
NO_CARD = frozenset({"(waits for a quieter card)"})  # a key no card has: waits, claims none

_PLAN_ARGS = set(inspect.signature(plan).parameters)
_WAITING_FIELDS = {f.name for f in fields(WaitingJob)}
_DEMAND_FIELDS = _WAITING_FIELDS & {f.name for f in fields(RunningClaim)}
NATIVE_PACK = "pack" in _PLAN_ARGS and "demand" in _DEMAND_FIELDS
NATIVE_PLACEMENT = "placement" in _PLAN_ARGS
NATIVE_HEAD_CLAIM = "head_claim" in _PLAN_ARGS  # the head's claim, kept from plan to plan
NATIVE_WAITED = "waited_s" in _WAITING_FIELDS  # how long a job has waited (rule 3's bound)
QUIETER = "quieter card"  # in plan()'s reason for a job that waits for one


@dataclass(frozen=True)
class Policy:
    name: str
    pack: str  # "contention" or "memory"
    placement: str = "most-free"  # or "best-fit"
    whole_gpu: bool = False  # every job without --mem
    strict: bool = False  # a what-if: every job waits for a card it keeps under 100 %

    @property
    def emulated(self) -> list[str]:
        """The parts of this policy that this checkout's plan() lacks (emulated here)."""
        missing = []
        if self.strict:
            missing.append("strict contention (a what-if, not a gpusched option)")
        elif self.pack == "contention" and not NATIVE_PACK:
            missing.append("pack: contention")
        if self.placement == "best-fit" and not NATIVE_PLACEMENT:
            missing.append("placement: best-fit")
        return missing


DEFAULT = Policy("default (contention)", "contention")
MEMORY = Policy("pack: memory", "memory")
BEST_FIT = Policy("best fit", "contention", "best-fit")
ONE_PER_GPU = Policy("one job per GPU", "memory", whole_gpu=True)
STRICT = Policy("strict contention", "contention", strict=True)
POLICIES = (DEFAULT, MEMORY, BEST_FIT, ONE_PER_GPU, STRICT)


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the simulation hands it over: what plan() needs and what the
    policy knows of its demand (None: no history)."""

    job: WaitingJob
    demand: float | None
    waited_s: float = 0.0  # since it was submitted (a retry: since its first attempt ended)


@dataclass(frozen=True)
class Running:
    claim: RunningClaim
    demand: float | None  # measured once it runs, else its history, else None


@dataclass
class Decision:
    placements: list[Placement]
    held_for_quiet: set[int]  # waiting jobs the contention rule kept off busy cards


@dataclass
class Carry:
    """What a scheduler keeps from one plan() to the next: the head's stored claim."""

    head_claim: Any = None


def _with_demand(item: Any, demand: float | None, waited_s: float | None = None) -> Any:
    if NATIVE_PACK:
        item = replace(item, demand=demand)
    if NATIVE_WAITED and waited_s is not None:
        item = replace(item, waited_s=waited_s)
    return item


def _plan(carry: Carry, *args: Any, **kwargs: Any) -> Any:
    """plan(), handing back the head's claim from the last call where plan() keeps one."""
    if NATIVE_HEAD_CLAIM:
        kwargs["head_claim"] = carry.head_claim
    result = plan(*args, **kwargs)
    carry.head_claim = getattr(result, "head_claim", None)
    return result


def place(
    policy: Policy,
    slots: list[GpuSlot],
    running: list[Running],
    waiting: list[Waiting],
    *,
    headroom: int,
    user_usage: dict[str, float],
    carry: Carry,
) -> tuple[Decision, int]:
    """Which waiting jobs start where under `policy`; and how many plan() calls it took."""
    kwargs: dict[str, Any] = {"user_usage": user_usage}
    if NATIVE_PACK:
        kwargs["pack"] = "memory" if policy.whole_gpu or policy.strict else policy.pack
    if NATIVE_PLACEMENT:
        kwargs["placement"] = policy.placement
    claims = [_with_demand(r.claim, r.demand) for r in running]
    jobs = [_with_demand(w.job, w.demand, w.waited_s) for w in waiting]
    if not policy.emulated:
        result = _plan(carry, slots, claims, jobs, headroom, **kwargs)
        quieter = {job for job, why in result.waiting_reasons.items() if QUIETER in why}
        return Decision(result.placements, quieter), 1
    demands = {r.claim.job_id: r.demand for r in running}
    queue = list(waiting)
    decision = Decision([], set())
    calls = 0
    while queue:
        keyed = []
        held: set[int] = set()
        cards = _Cards.of(slots, claims, demands, headroom)
        kept: frozenset[str] = frozenset()  # cards kept for the first job that waits for quiet
        memo: dict[tuple[int | None, int, float | None, frozenset[str]], _Keys] = {}
        for w in sorted(queue, key=lambda w: _plan_order(w.job, user_usage)):
            need = (w.job.mem_bytes, w.job.gpu_count, w.demand, kept)
            if need not in memo:
                memo[need] = emulated_keys(policy, w, cards, kept)
            keys, keep = memo[need]
            keyed.append(_keyed(w, keys))
            if keep is not None:
                held.add(w.job.job_id)
                kept = kept or frozenset(keep)
        calls += 1
        placements = _plan(carry, slots, claims, keyed, headroom, **kwargs).placements
        if not placements:
            decision.held_for_quiet = held
            break
        first = placements[0]
        decision.placements.append(first)
        placed = next(w for w in queue if w.job.job_id == first.job_id)
        queue.remove(placed)
        claims.append(
            _with_demand(
                RunningClaim(first.job_id, first.gpu_uuids, placed.job.mem_bytes, {}),
                placed.demand,
            )
        )
        demands[first.job_id] = placed.demand
    return decision, calls


_Keys = tuple[frozenset[str] | None, list[str] | None]
_KEYED: dict[tuple[WaitingJob, float | None, float, frozenset[str] | None], WaitingJob] = {}


def _keyed(waiting: Waiting, keys: frozenset[str] | None) -> WaitingJob:
    """`waiting`'s job restricted to `keys`, as plan() takes it (cached: a pass makes
    one per waiting job, most of them the same as the pass before)."""
    cache_key = (waiting.job, waiting.demand, waiting.waited_s, keys)
    job = _KEYED.get(cache_key)
    if job is None:
        if len(_KEYED) > 200_000:
            _KEYED.clear()
        job = replace(_with_demand(waiting.job, waiting.demand, waiting.waited_s), gpu_keys=keys)
        _KEYED[cache_key] = job
    return job


@dataclass(frozen=True)
class _Cards:
    """The usable cards as the emulated rules see them in one pass."""

    index: dict[str, int]
    count: dict[str, int]  # gpusched jobs on each
    load: dict[str, float]  # the sum of their demands; one with no demand known counts 1
    avail: dict[str, int]  # memory available to a new job (plan()'s rule 1)

    @classmethod
    def of(
        cls,
        slots: list[GpuSlot],
        claims: list[RunningClaim],
        demands: dict[int, float | None],
        headroom: int,
    ) -> _Cards:
        budgets = gpu_budgets(slots, claims, headroom)
        usable = [s for s in slots if s.usable]
        count = {s.uuid: 0 for s in usable}
        load = {s.uuid: 0.0 for s in usable}
        for claim in claims:
            for uuid in claim.gpu_uuids:
                if uuid in count:
                    count[uuid] += 1
                    known = demands.get(claim.job_id)
                    load[uuid] += 1.0 if known is None else known
        avail = {s.uuid: budgets[s.uuid].available_bytes for s in usable}
        return cls({s.uuid: s.index for s in usable}, count, load, avail)


def emulated_keys(policy: Policy, waiting: Waiting, cards: _Cards, kept: frozenset[str]) -> _Keys:
    """The cards `waiting` may start on under the rules plan() lacks (None: any), and,
    when it waits for a quieter card, the cards it would keep (the least loaded that fit
    it). `kept`: cards kept for a job ahead of it. Only for the emulation (docstring)."""
    job = waiting.job
    count, load, avail = cards.count, cards.load, cards.avail
    if job.mem_bytes is None:
        fits = [u for u in avail if count[u] == 0]
    else:
        fits = [u for u in avail if avail[u] >= job.mem_bytes]
    need = job.gpu_count
    if len(fits) < need:
        return None, None  # it waits for memory: plan() says why and claims (rule 5)
    fit = [u for u in fits if u not in kept]
    pool = fit
    if policy.pack == "contention" and (policy.strict or not NATIVE_PACK):
        demand = 1.0 if waiting.demand is None else waiting.demand
        quiet = [u for u in fit if load[u] + demand <= 1.0 + 1e-9]
        calm = [u for u in fit if load[u] < BUSY_DEMAND]
        if len(quiet) >= need:
            pool = quiet
        elif not policy.strict and (waiting.demand is None or demand < BUSY_DEMAND):
            pool = _least_loaded(fit, load, avail, need)
        elif not policy.strict and len(calm) >= need:
            pool = _least_loaded(calm, load, avail, need)
        else:
            return NO_CARD, _least_loaded(fits, load, avail, need)
    if policy.placement == "best-fit" and "placement: best-fit" in policy.emulated:
        pool = sorted(pool, key=lambda u: (avail[u], cards.index[u]))[:need]
    return (None if pool == fits else frozenset(pool)), None


def _plan_order(job: WaitingJob, usage: dict[str, float]) -> tuple[float, int, int]:
    """The order plan() takes waiting jobs in (its rule 2)."""
    place = job.job_id if job.queue_order is None else job.queue_order
    return (usage.get(job.user, 0.0), -job.priority, place)


def _least_loaded(
    cards: list[str], load: dict[str, float], avail: dict[str, int], need: int
) -> list[str]:
    """The `need` cards with the least compute load, then the most memory available."""
    return sorted(cards, key=lambda u: (load[u], -avail[u]))[:need]
