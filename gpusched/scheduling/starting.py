"""Starting placed jobs: from a policy placement to a running, watched supervisor.

Owns the order that keeps a start safe across a daemon crash and a cluster's fence: the
row is claimed (marked running) before the process starts, so a restart looks for its
supervisor instead of starting the job twice; past the node's launch deadline once the
claim has committed, the claim is given back and nothing is launched. Owns also the
job's environment, and what a failed start does: a transient failure (out of files,
memory or tasks) puts the job back in the queue, any other ends it. How each claim is
written (one server's rows, or conditioned on the node and epoch the cluster placed the
job under) is the ownership strategy's (scheduling.ownership `StartClaim`).
"""

from __future__ import annotations

import dataclasses
import logging

from gpusched.core.models import EndReason, GpuState, Job, JobState
from gpusched.core.sanitize import command_for_log, quoted
from gpusched.processes.devices import deny_rules
from gpusched.processes.environment import job_environment
from gpusched.processes.launching import Started, StartError
from gpusched.processes.output import job_log_path
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.host_limits import job_limits
from gpusched.scheduling.ownership import Ownership, StartClaim
from gpusched.scheduling.policy import Placement
from gpusched.scheduling.ratelog import RateLimitedLog
from gpusched.store import LaunchInfo, NodeGuard

log = logging.getLogger("gpusched.scheduler")

# A job just started is polled this soon, not a poll interval later: one that declared
# little and allocates much in its first seconds is seen, and its room reserved (or it is
# stopped, `overrun: kill`), before the next job is placed beside it by its word.
FIRST_POLL_S = 1.0


class JobStarter:
    """Starts the jobs a plan placed; called by the scheduler's tick, under its lock."""

    def __init__(self, context: Context, endings: JobEndings, node: Ownership) -> None:
        """`node`: this server's name, recorded with each start, told of each process
        started (the cluster's keeps them, to stop those the cluster gave to another
        node while this daemon was away), and how each start claims its job."""
        self._config = context.settings
        self.store = context.store  # what the ownership strategy claims each start in
        self.jobs = context.store.jobs
        self.probe = context.probe
        self.launcher = context.launcher
        self.monitor = context.monitor
        self.endings = endings
        self.clock = context.clock
        self.wake_in = context.wake_in
        self.node = node
        self.trouble = RateLimitedLog(log)  # problems that recur every pass, said once a minute

    def start(self, placements: list[Placement], gpus: list[GpuState]) -> None:
        """Start each placed job on its GPUs (a job that cannot start is queued or ended)."""
        by_uuid = {g.uuid: g for g in gpus}
        claim = self.node.start_claim(self.store, self.clock)
        for placement in placements:
            chosen = [by_uuid[u] for u in placement.gpu_uuids]
            job, info = self.jobs.job_and_launch(placement.job_id)  # one read a start
            self._launch(job, chosen, claim, info=info)

    def start_placed(
        self, job: Job, gpus: list[GpuState], guard: NodeGuard, account: tuple[int, int]
    ) -> bool:
        """Start a job the cluster's scheduler placed on this node (scheduling.cluster)
        under `guard` (the node and epoch it was placed with), as its user's `account`
        (uid, gid) here: False if the database refused the claim (the node is fenced or
        was declared down)."""
        claim = self.node.start_claim(self.store, self.clock, guard)
        uid, gid = account
        if uid == job.uid:
            return self._launch(job, gpus, claim)
        # The same user name has another uid on this server: run as this server's.
        return self._launch(dataclasses.replace(job, uid=uid), gpus, claim, gid)

    def _launch(
        self,
        job: Job,
        gpus: list[GpuState],
        claim: StartClaim,
        local_gid: int | None = None,
        *,
        info: LaunchInfo | None = None,
    ) -> bool:
        """Start a queued job on `gpus` (`info`: its launch parts, if read with its row)."""
        job_id = job.id
        info = info or self.jobs.launch_info(job_id)
        indices = [g.index for g in gpus]
        uuids = [g.uuid for g in gpus]
        if job.interactive:
            return self._place_interactive(job, info, indices, uuids, claim)
        fence = self._fence(uuids)
        env = self._environment(job, info, gpus, fenced=bool(fence))
        # Mark running *before* starting: if the daemon dies in between, a restart finds
        # a running row with no pid and looks for its supervisor, so nothing starts twice.
        log_path = job_log_path(job, str(self.launcher.log_path(job_id)))  # --output
        if not claim.take(job_id, indices, uuids, log_path):
            return False
        deadline = self.node.launch_deadline
        if self._past(deadline):
            # The claim's commit came back after this node's launch deadline: the cluster
            # may declare the node down any moment now and give the job to another node.
            claim.give_back(job_id)
            self.trouble.warning("fenced", f"job {job_id} not launched: this node's lease ran out")
            return False
        self.monitor.started(job)  # before: its end (even a failed start) forgets it
        gid = info.gid if local_gid is None else local_gid
        started = self._start_process(job, env, info, gid, deadline, fence=fence)
        if started is None:
            return False
        claim.launched(job_id, started.pid, started.start_time)
        self.node.started(job_id, started.pid, started.start_time)
        self.probe.note_job_started(started.pid, uuids, job.mem, env)
        self.wake_in(FIRST_POLL_S)
        log.info(
            "job %s started on GPU %s (pid %s, via %s) as %s: %s",
            job_id,
            ",".join(map(str, indices)),
            started.pid,
            started.via,
            quoted(job.user, 40),
            command_for_log(job.command, self._config.current.show_commands),
        )
        return True

    def _environment(
        self, job: Job, info: LaunchInfo, gpus: list[GpuState], *, fenced: bool
    ) -> dict[str, str]:
        """The job's environment. A job fenced off the other cards gets its cards' UUIDs in
        CUDA_VISIBLE_DEVICES whatever `visible_devices` says: CUDA may then number only the
        cards the job can open (under Slurm's ConstrainDevices a job's devices count from
        0), so an NVML index could name another card or none; a UUID names the same card."""
        fenced = fenced and self.launcher.fences_devices
        return job_environment(
            job,
            info.env,
            [g.index for g in gpus],
            [g.uuid for g in gpus],
            "uuid" if fenced else self._config.current.visible_devices,
            gpu_totals=[g.total_bytes for g in gpus],
        )

    def _start_process(
        self,
        job: Job,
        env: dict[str, str],
        info: LaunchInfo,
        gid: int,
        deadline: float | None,
        *,
        fence: list[str],
    ) -> Started | None:
        """The job's supervisor, started as `gid` and fenced off the cards in `fence`;
        None if it could not start (the job queued again when the failure is transient,
        else ended)."""
        job_id = job.id
        try:
            # The supervisor checks the deadline again right before exec (same CLOCK_MONOTONIC).
            # Its --ram and --cpus, or its GPUs' share of the server's (host_limits).
            limited = job_limits(job, self.launcher.host_facts(), self._config.current)
            return self.launcher.start(
                limited, env, info.umask, gid, exec_by=deadline, deny_devices=fence
            )
        except StartError as exc:
            # Out of files, memory or tasks for now: the job keeps its place in the queue
            # and the next pass tries again (said once a minute, not once a pass).
            if exc.transient and self.jobs.unmark_running(job_id):
                self.trouble.warning("start", f"job {job_id} cannot start yet: {exc}: queued")
                return None
            log.warning("job %s failed to start: %s", job_id, quoted(str(exc), 500))
            self.endings.end(job_id, JobState.FAILED, EndReason.FAILED_TO_START, detail=str(exc))
            return None

    def _fence(self, uuids: list[str]) -> list[str]:
        """The device rules that keep a job on `uuids` off every other card: their minor
        numbers, from a probe that reads them (`device_minors` is optional: NVML's)."""
        read = getattr(self.probe, "device_minors", None)
        minors: dict[str, int] = read() if read is not None else {}
        return deny_rules(m for uuid, m in minors.items() if uuid not in uuids)

    def _past(self, deadline: float | None) -> bool:
        return deadline is not None and self.clock.monotonic() >= deadline

    def _place_interactive(
        self,
        job: Job,
        info: LaunchInfo,
        indices: list[int],
        uuids: list[str],
        claim: StartClaim,
    ) -> bool:
        """An interactive job starts as its client learns its placement: nothing is
        launched; its client (pid) is the root of its process tree, and it has no log.
        In a cluster it was placed on this server, its client's."""
        if job.pid is None:
            return False
        fence = self._fence(uuids) if self.launcher.fences_devices else []
        if job.ram is not None or job.cpus is not None or fence:
            # Its --ram and --cpus, and its fence off the other cards: its client, and what
            # it starts, in cgroups of its own before the client learns its placement (the
            # claim below tells it).
            try:
                self.launcher.confine_client(job, job.pid, info.pid_start_time, deny=fence)
            except StartError as exc:
                log.warning("job %s failed to start: %s", job.id, quoted(str(exc), 500))
                self.endings.end(
                    job.id, JobState.FAILED, EndReason.FAILED_TO_START, detail=str(exc)
                )
                return False
        if not claim.take_client(job.id, indices, uuids, (job.pid, info.pid_start_time)):
            return False
        self.monitor.started(job)
        self.probe.note_job_started(job.pid, uuids, job.mem, info.env)
        log.info(
            "interactive job %s placed on GPU %s (client pid %s) for %s",
            job.id,
            ",".join(map(str, indices)),
            job.pid,
            quoted(job.user, 40),
        )
        return True
