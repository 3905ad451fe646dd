"""`plan()`: the turn-taking loop over one plan's state.

Jobs an administrator put first (`gpusched top`) go first, in the order they were put
there. Then users take turns (module turns): the user with the fewest placements so far
in this plan goes next, ties to the one who used least recently (fair share), then to the
one whose next job was submitted first; a user's own jobs go by `--priority`, then submit
order. Each job's turn is module consider's. A job with no cap to ask gets what its ask
was told before, where that holds, without the rest of its turn: a long queue costs a
look-up a job. Pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from gpusched.scheduling.policy.budget import GpuSlot, RunningClaim, budget_table
from gpusched.scheduling.policy.consider import consider, consider_cards
from gpusched.scheduling.policy.data import HeadClaim, Plan, UserCap, WaitingJob
from gpusched.scheduling.policy.host import HostRoom
from gpusched.scheduling.policy.settings import Settings
from gpusched.scheduling.policy.state import PlanState
from gpusched.scheduling.policy.topology import Topology
from gpusched.scheduling.policy.turns import in_turns, submit_place


def plan(
    gpus: Sequence[GpuSlot],
    running: Sequence[RunningClaim],
    waiting: Sequence[WaitingJob],
    headroom_bytes: int = 0,
    max_jobs_per_gpu: int | None = None,
    *,
    user_caps: Mapping[str, UserCap] | None = None,
    user_usage: Mapping[str, float] | None = None,
    busy_util: float | None = None,
    head_claim: HeadClaim | None = None,
    topology: Topology | None = None,
    placement: str = "most-free",
    pack: str = "contention",
    hosts: Mapping[str, HostRoom] | None = None,
) -> Plan:
    """Decide which waiting jobs start now and where (the package's rules, in order), and
    which cards the blocked head keeps (`head_claim`: last plan's, to keep). `hosts`: each
    server's room for --ram and --cpus by node name (the host rule). Pure."""
    settings = Settings(
        max_jobs_per_gpu=max_jobs_per_gpu,
        busy_util=busy_util,
        placement=placement,
        pack=pack,
        topology=topology,
        caps=user_caps or {},
        stored_claim=head_claim,
        several_nodes=len({gpu.node for gpu in gpus}) > 1,
        hosts=hosts or {},
    )
    state = PlanState.start(budget_table(gpus, running, headroom_bytes), running, waiting, settings)
    usage = user_usage or {}
    topped, queues = in_turns(waiting, usage)
    for job in topped:
        consider(state, job)
    _take_turns(state, queues, usage)
    return state.result()


def _take_turns(
    state: PlanState, queues: dict[str, list[WaitingJob]], usage: Mapping[str, float]
) -> None:
    """Users' turns, each user's jobs for as long as the user stays first (or is last)."""
    caps = state.settings.caps
    # Bound once: a long queue asks them of every job.
    told_before, said_to = state.reasons.told_before, state.reasons.said
    turns = [
        (0, usage.get(user, 0.0), submit_place(queue[-1]), user) for user, queue in queues.items()
    ]
    heapq.heapify(turns)
    while turns:
        taken, used, _, user = heapq.heappop(turns)
        queue = queues[user]
        cap = caps.get(user)
        capped = cap is not None and cap.max_running is not None
        while queue:
            job = queue.pop()
            if job.array_cap is not None or capped:
                taken += consider(state, job)
            elif (said := told_before(job)) is not None:
                said_to[job.job_id] = said
            else:
                taken += consider_cards(state, job, cap)
            if queue and turns:
                turn = (taken, used, submit_place(queue[-1]), user)
                if turn > turns[0]:
                    heapq.heappush(turns, turn)
                    break
