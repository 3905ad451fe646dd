"""One scheduling pass as a named list of phases, each a function of the pass's parts.

    end abandoned backends -> settle -> check interactive clients (under the lock) ->
    look at the host (outside it) -> observe -> act on usage -> place -> publish (under
    the lock again), then notify (outside it).

end abandoned backends: on PostgreSQL, end a backend of the daemons' role left waiting
on its client mid-transaction (a pipeline cut by a partition), which holds rows any
later phase may wait on (gpusched.store.abandoned; at most every few seconds).
settle: record the ends that could not be written when they happened (raises while the
database is away: the pass is retried). check interactive clients: end the jobs whose
client is gone, stop those past their time, before the plan counts their memory.
look at the host: read the GPUs and walk every process on the host (observe.look),
touching no job. It is the longest step on a busy host, and the lock it is kept out of
is the one a job's end is recorded under (the exit watcher's thread): held for the walk,
ends under churn waited on it most of the time and were recorded a minute late. The
lock is let go between the two holds for the same reason: an end waits at most for one
of them, never for a whole pass. observe: this server's running jobs and what they hold
on the GPUs looked at (observe.py). act on
usage: record (or stop, `overrun: kill`) the jobs over their declared memory, and note
idle interactive ones. place: the placer's phase (placers.py: one server's, or the
cluster agent's), which runs the shared pass rules (pass_rules.py) and starts jobs.
publish: keep what was read and decided, for `status`. notify: interactive clients
waiting for their placement look again. A failing check or usage step is logged and
never stops scheduling.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.interactive import InteractiveJobs
from gpusched.scheduling.observe import HostView, Observation, look, observe
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
    # One pass at a time, whoever runs it: the scheduler's lock no longer spans a pass.
    passing: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Pass:
    """What one pass has found and decided so far."""

    host: HostView | None = None
    seen: Observation | None = None
    plan: Plan | None = None

    def looked(self) -> HostView:
        if self.host is None:
            raise RuntimeError("a phase ran before the pass looked at the host")
        return self.host

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


def look_at_host(parts: Parts, this: Pass) -> None:
    context = parts.context
    this.host = look(context.probe, context.config, parts.reading.latest.gpus)


def observe_gpus_and_jobs(parts: Parts, this: Pass) -> None:
    context = parts.context
    this.seen = observe(
        this.looked(),
        context.probe,
        context.monitor,
        context.config,
        running=[j for j in context.store.jobs.running() if parts.node.owns(j)],
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
    parts.reading.latest = Reading(seen.gpus, seen.usage, reasons, seen.jobs_pids, seen.seen_pids)


def notify(parts: Parts, this: Pass) -> None:
    parts.interactive.notify_placed()


Phases = tuple[tuple[str, Phase], ...]
# In order: (whether the scheduler's lock is held, the phases run so).
STEPS: tuple[tuple[bool, Phases], ...] = (
    (
        True,
        (
            ("end abandoned database backends", end_abandoned),
            ("settle", settle),
            ("check interactive clients", check_interactive_clients),
        ),
    ),
    (False, (("look at the host", look_at_host),)),
    (
        True,
        (
            ("observe", observe_gpus_and_jobs),
            ("act on usage", act_on_usage),
            ("place", place),
            ("publish", publish),
        ),
    ),
    (False, (("notify", notify),)),
)


def run_pass(parts: Parts) -> Plan:
    """One pass: each step's phases, under the lock or outside it as STEPS says."""
    this = Pass()
    with parts.passing:
        for locked, phases in STEPS:
            with parts.context.lock if locked else contextlib.nullcontext():
                for _name, phase in phases:
                    phase(parts, this)
    return this.plan or Plan([], {}, {})
