"""One scheduling pass as a named list of phases, each a function of the pass's parts.

    end abandoned backends -> settle -> check interactive clients -> observe -> act on
    usage -> place -> publish (under the lock), then notify (outside it).

end abandoned backends: on PostgreSQL, end a backend of the daemons' role left waiting
on its client mid-transaction (a pipeline cut by a partition), which holds rows any
later phase may wait on (gpusched.store.abandoned; at most every few seconds).
settle: record the ends that could not be written when they happened (raises while the
database is away: the pass is retried). check interactive clients: end the jobs whose
client is gone, stop those past their time, before the plan counts their memory.
observe: the GPUs, this server's running jobs and what they hold (observe.py). act on
usage: record (or stop, `overrun: kill`) the jobs over their declared memory, and note
idle interactive ones. place: the placer's phase (placers.py: one server's, or the
cluster agent's), which runs the shared pass rules (pass_rules.py) and starts jobs.
publish: keep what was read and decided, for `status`. notify: interactive clients
waiting for their placement look again. A failing check or usage step is logged and
never stops scheduling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.interactive import InteractiveJobs
from gpusched.scheduling.observe import Observation, observe
from gpusched.scheduling.ownership import Ownership
from gpusched.scheduling.placers import Placer
from gpusched.scheduling.policy import Plan
from gpusched.scheduling.reading import LatestReading, Reading
from gpusched.scheduling.stopping import act_on_overruns
from gpusched.store.abandoned import AbandonedBackends

log = logging.getLogger("gpusched.scheduler")


@dataclass(frozen=True)
class Parts:
    """What the phases act through, built once by the scheduler."""

    context: Context
    node: Ownership
    endings: JobEndings
    interactive: InteractiveJobs
    placer: Placer
    reading: LatestReading
    abandoned: AbandonedBackends = field(default_factory=AbandonedBackends)


@dataclass
class Pass:
    """What one pass has found and decided so far."""

    seen: Observation | None = None
    plan: Plan | None = None

    def observed(self) -> Observation:
        if self.seen is None:
            raise RuntimeError("a phase ran before the pass observed anything")
        return self.seen


Phase = Callable[[Parts, Pass], None]


def end_abandoned(parts: Parts, this: Pass) -> None:
    """First: a database backend its client abandoned mid-transaction may hold a row any
    later phase waits on (gpusched.store.abandoned)."""
    parts.abandoned.end_due(parts.context.store.database, parts.context.clock.monotonic())


def settle(parts: Parts, this: Pass) -> None:
    parts.endings.settle_unsettled()


def check_interactive_clients(parts: Parts, this: Pass) -> None:
    try:
        parts.interactive.check_clients()
    except Exception:  # one bad client must never stop scheduling
        log.exception("checking the interactive jobs' clients failed")


def observe_gpus_and_jobs(parts: Parts, this: Pass) -> None:
    context = parts.context
    this.seen = observe(
        context.probe,
        context.monitor,
        context.config,
        running=[j for j in context.store.jobs.running() if parts.node.owns(j)],
        last=parts.reading.latest.gpus,
        now=context.clock(),
    )


def act_on_usage(parts: Parts, this: Pass) -> None:
    seen = this.observed()
    try:
        act_on_overruns(parts.context, parts.endings, parts.interactive, seen.overruns)
        parts.interactive.observe_idle(seen.running, seen.idle_evidence)
    except Exception:  # acting on what was measured must never stop scheduling
        log.exception("acting on the running jobs' usage failed")


def place(parts: Parts, this: Pass) -> None:
    this.plan = parts.placer.place(this.observed())


def publish(parts: Parts, this: Pass) -> None:
    seen = this.observed()
    # A cluster daemon that did not schedule keeps the reasons it last had; the elected
    # scheduler's are in the jobs' rows too.
    reasons = (
        parts.reading.latest.waiting_reasons if this.plan is None else this.plan.waiting_reasons
    )
    parts.reading.latest = Reading(seen.gpus, seen.usage, reasons)


def notify(parts: Parts, this: Pass) -> None:
    parts.interactive.notify_placed()


UNDER_LOCK: tuple[tuple[str, Phase], ...] = (
    ("end abandoned database backends", end_abandoned),
    ("settle", settle),
    ("check interactive clients", check_interactive_clients),
    ("observe", observe_gpus_and_jobs),
    ("act on usage", act_on_usage),
    ("place", place),
    ("publish", publish),
)
AFTER_LOCK: tuple[tuple[str, Phase], ...] = (("notify", notify),)


def run_pass(parts: Parts) -> Plan:
    """One pass: the phases under the lock, then those after it."""
    this = Pass()
    with parts.context.lock:
        for _name, phase in UNDER_LOCK:
            phase(parts, this)
    for _name, phase in AFTER_LOCK:
        phase(parts, this)
    return this.plan or Plan([], {}, {})
