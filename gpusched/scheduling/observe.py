"""The observe phase of a pass (phases.py): read the GPUs and what each running job holds.

`look()` reads the GPUs and walks the host's processes, touching no job: the pass makes
it outside the scheduler's lock, so that a job's end is not kept waiting by a walk of
every process on a busy host. `observe()`, under the lock, returns an `Observation`: the
GPU reading (every card marked lost when the probe fails, so nothing starts and the
daemon lives on), the running jobs, each job's memory per GPU, and the jobs newly over
their declared memory. It changes no job: the scheduler decides what to do about an
overrun. The usage monitor is fed here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpusched.config.settings import Config
from gpusched.core.clock import iso
from gpusched.core.errors import GpuError
from gpusched.core.models import GpuHealth, GpuState, Job
from gpusched.gpus.probe import Probe, apply_selection
from gpusched.scheduling.idle_evidence import Evidence, poll_evidence
from gpusched.usage.attribution import (
    Outsider,
    ProcessChildren,
    attribute_processes,
    held_bytes,
    jobs_pids,
    outsiders,
    process_children,
)
from gpusched.usage.monitor import Overrun, UsageMonitor

log = logging.getLogger("gpusched.scheduler")


@dataclass(frozen=True)
class Observation:
    gpus: list[GpuState]
    running: list[Job]
    usage: dict[int, dict[str, int]]  # job id -> GPU uuid -> bytes it holds
    overruns: list[Overrun]  # jobs newly over their declared memory
    # Interactive jobs: whether this poll shows each using its GPU (idle_evidence.py).
    idle_evidence: dict[int, Evidence] = field(default_factory=dict)
    # Per GPU uuid, the largest process there gpusched did not start (a waiting job's
    # reason names it where it takes the room; an OOM it caused is not the job's).
    outsiders: dict[str, Outsider] = field(default_factory=dict)
    # Per GPU uuid, the pids there in a running job's tree. A reading outlives the moment
    # it was made: a job's process that exits before the next one (a job in its SIGTERM
    # grace) is still the job's there, its memory counted as the job's, not an unknown
    # other's whose /proc entry has gone.
    jobs_pids: dict[str, frozenset[int]] = field(default_factory=dict)
    # The GPUs' pids the walk of /proc found: one gone by the time `status` asks has
    # exited, one never found is another pid namespace's (process_owners.py).
    seen_pids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class HostView:
    """The GPUs and the host's processes, as `look` found them."""

    gpus: list[GpuState]
    children: ProcessChildren  # empty: no GPU shows a process, no walk was needed


def look(probe: Probe, config: Config, last: Sequence[GpuState]) -> HostView:
    """Read the GPUs; walk the host's processes if any GPU shows one (outside the lock)."""
    gpus = read_gpus(probe, config, last)
    walked = process_children() if any(g.processes for g in gpus) else {}
    return HostView(gpus, walked)


def read_gpus(probe: Probe, config: Config, last: Sequence[GpuState]) -> list[GpuState]:
    """The probe's reading with the config's GPU selection applied; `last`: the previous one."""
    try:
        gpus = probe.snapshot()
    except GpuError as exc:
        # Hardware that read fine at start-up and now fails: show every card lost,
        # start nothing, keep the daemon alive; the next tick tries again.
        log.error("cannot read GPUs: %s", exc.message)
        gpus = [
            GpuState(
                g.index, g.uuid, g.name, g.total_bytes, 0, 0, None, GpuHealth.LOST, (), exc.message
            )
            for g in last
        ]
    gpus = apply_selection(gpus, config.gpus)
    log_health_changes(last, gpus)
    return gpus


def log_health_changes(last: Sequence[GpuState], now: Sequence[GpuState]) -> None:
    """Say in the daemon's log when a GPU is lost, comes back, or is excluded or included
    (the first reading after a start has nothing to compare with)."""
    before = {g.uuid: g for g in last}
    for gpu in now:
        old = before.get(gpu.uuid)
        if old is None or old.health == gpu.health:
            continue
        if gpu.health == GpuHealth.LOST:
            log.error("GPU %d (%s) lost: %s; no job starts on it", gpu.index, gpu.uuid, gpu.error)
        elif old.health == GpuHealth.LOST:
            log.warning("GPU %d (%s) is back (%s)", gpu.index, gpu.uuid, gpu.health)
        else:
            log.info("GPU %d (%s) is now %s", gpu.index, gpu.uuid, gpu.health)


def observe(
    host: HostView,
    probe: Probe,
    monitor: UsageMonitor,
    config: Config,
    *,
    running: list[Job],
    now: datetime,
) -> Observation:
    """What each running job holds on the GPUs `host` shows, and what follows from it.
    A job started since `host` was looked at has no processes in it: its next pass
    counts them."""
    gpus = host.gpus
    processes = attribute_processes(gpus, running, host.children)
    others = outsiders(gpus, processes)
    monitor.observe_gpus(gpus)
    overruns: list[Overrun] = []
    process_util = None
    if processes:
        try:
            sample = getattr(probe, "process_utilization", None)  # NVML only
            if sample is not None:
                try:
                    process_util = sample()
                except GpuError as exc:
                    log.warning("cannot sample per-process utilization: %s", exc.message)
            overruns = monitor.observe(
                now_s=now.timestamp(),
                now_iso=iso(now),
                gpus=gpus,
                running=running,
                processes=processes,
                process_util=process_util,
                margin_fraction=config.overrun_margin_fraction,
                margin_bytes=config.overrun_margin_bytes,
                outsiders=others,
            )
        except Exception:  # measuring must never stop scheduling
            log.exception("watching the running jobs' usage failed")
    evidence = {
        job.id: poll_evidence(processes.get(job.id), gpus, process_util)
        for job in running
        if job.interactive
    }
    usage = held_bytes(processes)
    seen = _seen_pids(gpus, host.children)
    return Observation(gpus, running, usage, overruns, evidence, others, jobs_pids(processes), seen)


def _seen_pids(gpus: Sequence[GpuState], children: ProcessChildren) -> frozenset[int]:
    """The GPUs' pids among those the walk of the process table found."""
    walked = {pid for pids in children.values() for pid in pids}
    return frozenset(p.pid for g in gpus for p in g.processes if p.pid in walked)
