"""The scheduling policy: a pure function from a snapshot to placements.

`plan()` (module loop) takes plain data (GPUs as read now, the claims of running jobs,
the jobs that may start, the head's stored claim) and returns plain data (which job goes
where, why each other job waits, the head's claim to store). No I/O, no clock, no
randomness: the modules here import nothing of the store, the processes, the config or
the hardware (an import-linter contract in pyproject.toml).

What a GPU has left is module budget's; the plan's working state is module state's; the
order jobs are considered in is module turns' (fair share); one job's turn is module
consider's, which asks the rules below. How a card is chosen, one ordered rule, as
docs/operations.md "How a card is chosen" documents it:

0. Before any card: the array cap (array_cap) and the owner's caps (caps:
   `max_running`; `max_mem` on the cards chosen), and the cards a job may take at all
   (card_limits: `max_jobs_per_gpu`, `busy_util`; exclusive: a whole-GPU or
   `--exclusive` job needs a card with no gpusched job, which then takes none).
1. The head's claim (head_claim). The first job in the order that cannot start now
   (the head) claims the card(s) expected to free soonest for it: by memory, or every
   gpusched job there for a whole-GPU or `--exclusive` head; a job behind it may start
   on a claimed card by memory backfill (not beside a whole-GPU or `--exclusive` head)
   or time backfill.
2. Big cards for big jobs (keep_for_bigger): not the only cards a waiting larger job
   could use; under contention, unless no card left takes the job quietly while a card
   kept so would, with room beside it for every larger waiting job that could use it
   (then that card: it delays none of them; choice).
3. Contention (contention; `pack: contention`, the default): quiet cards first, busy
   jobs apart, and a job that would slow or be slowed waits for a quieter card, bounded
   by the cards kept for the first such job (quieter); a card where sharing would slow
   the job, or a job with a `--time` there, past its limit is not its (time_limits: held
   for a quieter card alike when no other is left).
4. A multi-GPU job's tightest set by NVML topology (topology).
5. The most available memory (most_free: `placement: most-free`, the mission's rule), or
   the least that fits (`placement: best-fit`); ties to the lower index.
Beside the cards, the host rule (host): a job's `--ram` and `--cpus` within what its
server has free now, else it waits (and claims no card); asked once cards are found.
Why a job waits is said by the rule that holds it, remembered by ask (reasons, why_not).

Where the order of calls differs from that list (kept as it is; module consider lists
the calls): contention's wait (3) is decided before rule 2 narrows the cards; the memory
cap is checked after the cards are chosen; the head's claim (1) is computed only after a
job fails to start, so the first job that fails is the head.
"""

from gpusched.scheduling.policy.budget import GpuBudget, GpuSlot, RunningClaim, gpu_budgets
from gpusched.scheduling.policy.data import HeadClaim, Placement, Plan, UserCap, WaitingJob
from gpusched.scheduling.policy.host import HostRoom
from gpusched.scheduling.policy.loop import plan
from gpusched.scheduling.policy.turns import UsageSpan, decayed_usage, in_turns

__all__ = [
    "GpuBudget",
    "GpuSlot",
    "HeadClaim",
    "HostRoom",
    "Placement",
    "Plan",
    "RunningClaim",
    "UsageSpan",
    "UserCap",
    "WaitingJob",
    "decayed_usage",
    "gpu_budgets",
    "in_turns",
    "plan",
]
