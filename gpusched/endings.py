"""How jobs end, and what a restarted daemon makes of the jobs it finds running.

`JobEndings` is the part of the scheduler that turns a supervisor's outcome into a job's
final state (exit, signal, cancel, timeout, failed start, out of memory, lost), records
what the job used, queues an OOM retry, and re-adopts running jobs after a restart:
a `running` row is a claim to verify, not a fact. `Scheduler` inherits it; the
attributes it uses are the scheduler's own, declared below.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.clock import Clock, iso
from gpusched.config import Config
from gpusched.gpus import Probe
from gpusched.launcher import (
    Launcher,
    Outcome,
    find_supervisor,
    is_same_process,
    process_start_time,
)
from gpusched.models import (
    EndReason,
    GpuState,
    Job,
    JobState,
)
from gpusched.monitor import UsageMonitor, final_usage, oom_cause, retry_mem
from gpusched.store import Store
from gpusched.supervisor import write_json_atomically

log = logging.getLogger("gpusched.scheduler")

# How a supervisor's outcome (other than a plain exit) ends a job; anything else is lost.
_ENDINGS: dict[str, tuple[JobState, EndReason]] = {
    "signal": (JobState.FAILED, EndReason.SIGNAL),
    "cancelled": (JobState.CANCELLED, EndReason.CANCELLED),
    "timeout": (JobState.FAILED, EndReason.TIMEOUT),
    "failed_to_start": (JobState.FAILED, EndReason.FAILED_TO_START),
}


class JobEndings:
    config: Config
    store: Store
    probe: Probe
    launcher: Launcher
    monitor: UsageMonitor
    clock: Clock
    wake: Callable[[], None]
    end_listeners: list[Callable[[int, bool], None]]
    _lock: Any  # a threading.RLock: ticks and job operations take it
    _ended: threading.Condition
    _recent_ends: deque[int]
    _end_count: int
    _reading: Any  # the scheduler's latest GPU reading
    _current_gpus: Callable[[], list[GpuState]]

    def _end(
        self,
        job_id: int,
        state: JobState,
        reason: EndReason,
        *,
        exit_code: int | None = None,
        detail: str | None = None,
        retry: Job | None = None,
        retry_refused: str | None = None,
        oom_next_mem: int | None = None,
        durable: bool = True,
        job: Job | None = None,
    ) -> bool:
        """`durable=False`: the ending comes from the supervisor's exit record (Store).

        `job`: its row if the caller has just read it (under the lock), else it is read.
        """
        now = iso(self.clock())
        job = job or self.store.get(job_id)
        hooks_due = bool(self.config.on_finish or job.notify)
        ended = self.store.mark_ended(
            job_id,
            state=state,
            reason=str(reason),
            now=now,
            exit_code=exit_code,
            detail=detail,
            usage=self._final_usage(job, state, reason, now, (retry, retry_refused, oom_next_mem)),
            hooks_due=hooks_due,
            durable=durable,
        )
        if ended:
            log.info("job %s %s (%s)%s", job_id, state, reason, f": {detail}" if detail else "")
            self._announce_ends([(job_id, hooks_due)])
        return ended

    def _announce_ends(self, ended: list[tuple[int, bool]]) -> None:
        """Tell waiters and end listeners that these jobs have ended (after the commit):
        (job id, whether it has notification hooks to run) for each."""
        if not ended:
            return
        with self._ended:
            self._recent_ends.extend(job_id for job_id, _ in ended)
            self._end_count += len(ended)
            self._ended.notify_all()
        for job_id, hooks_due in ended:
            for listener in self.end_listeners:
                try:
                    listener(job_id, hooks_due)
                except Exception:  # a listener's bug must not undo the job's ending
                    log.exception("end listener failed for job %s", job_id)

    def _final_usage(
        self,
        job: Job,
        state: JobState,
        reason: EndReason,
        now: str,
        oom: tuple[Job | None, str | None, int | None],
    ) -> dict[str, object] | None:
        """A job's measured figures and hints at its end (None for a job that never ran).

        `oom`, after an out-of-memory end: its retry, why there is none although one was
        asked for, and the --mem a retry takes.
        """
        try:
            if job.started_at is None:
                return None
            totals = [g.total_bytes for g in self._reading.gpus if g.uuid in job.gpu_uuids]
            return final_usage(
                job,
                self.monitor.finish(job),
                state=str(state),
                reason=str(reason),
                ended_at=now,
                min_runtime_s=self.config.hint_min_runtime_s,
                card_bytes=min(totals) if totals else None,
                retry=oom[0],
                retry_refused=oom[1],
                oom_next_mem=oom[2],
            )
        except Exception:  # the figures must never keep a job from ending
            log.exception("summing up the usage of job %s failed", job.id)
            return None

    def _end_oom(self, job: Job, outcome: Outcome, cause: str, durable: bool) -> None:
        """End a job that ran out of GPU memory; queue its retry if it asked for one."""
        mem, why_not = retry_mem(job, self._current_gpus(), self.config.headroom_bytes)
        retry = self.store.add_retry(job.id, mem) if mem is not None and job.retry_oom else None
        if retry is not None:
            log.info("job %s ran out of GPU memory: retried as job %s", job.id, retry.id)
            self.wake()
        self._end(
            job.id,
            JobState.FAILED,
            EndReason.OOM,
            job=job,
            exit_code=outcome.exit_code,
            detail=cause,
            retry=retry,
            retry_refused=why_not if retry is None and job.retry_oom else None,
            oom_next_mem=mem,
            durable=durable,
        )

    def _on_job_exit(self, job_id: int) -> None:
        """Called by the launcher's watcher thread when a job's supervisor exits."""
        with self._lock:
            # Not fsynced: the outcome stays on disk in the exit record (see Store).
            self._settle(job_id, self.launcher.outcome(job_id), durable=False)
        self.wake()

    def _settle(self, job_id: int, outcome: Outcome, *, durable: bool = True) -> None:
        job = self.store.get(job_id)
        if job.state != JobState.RUNNING:
            return
        if (
            outcome.kind == "lost"
            and job.reason_detail
            and job.reason_detail.startswith("cancelled")
        ):
            # A cancel that reached the supervisor before it set up its SIGTERM handler
            # killed it outright; it sets the handler before starting the job, so the job
            # never started: the cancel simply won.
            outcome = Outcome("cancelled")
        if outcome.kind == "cancelled" and (job.reason_detail or "").startswith("overrun: "):
            self._end(
                job_id,
                JobState.FAILED,
                EndReason.OVERRUN,
                exit_code=outcome.exit_code,
                detail=(job.reason_detail or "")[len("overrun: ") :],
                durable=durable,
                job=job,
            )
            return
        if outcome.kind == "signal" or (outcome.kind == "exit" and outcome.exit_code != 0):
            # The tracker is in memory, or after a restart in the database (a minute old).
            cause = oom_cause(job, self.monitor.tracker(job))
            if cause is not None:
                self._end_oom(job, outcome, cause, durable)
                return
        if outcome.kind == "exit":
            state = JobState.DONE if outcome.exit_code == 0 else JobState.FAILED
            self._end(
                job_id, state, EndReason.EXIT, exit_code=outcome.exit_code, durable=durable, job=job
            )
            return
        state, reason = _ENDINGS.get(outcome.kind, (JobState.LOST, EndReason.LOST))
        detail = outcome.message
        if reason == EndReason.CANCELLED:
            detail = job.reason_detail or "cancelled"  # who cancelled it, noted at the request
        self._end(
            job_id,
            state,
            reason,
            exit_code=outcome.exit_code,
            detail=detail,
            durable=durable,
            job=job,
        )

    def _rebooted(self) -> bool:
        """Whether the machine restarted since the last daemon run (then remember this boot).

        Unknown (no record yet) counts as a reboot: the careful answer.
        """
        record = self.config.state_dir / "boot.json"
        try:
            now = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return True
        try:
            before = json.loads(record.read_text()).get("boot_id")
        except (OSError, ValueError, AttributeError):
            before = None
        if before != now:
            try:
                write_json_atomically(record, {"boot_id": now})
            except OSError as exc:
                log.warning("cannot record the boot id in %s: %s", record, exc)
        return before != now

    def adopt_running(self) -> None:
        """After a (re)start: a `running` row is a claim to verify, not a fact."""
        rebooted = self._rebooted()
        with self._lock:
            for job in self.store.active():
                if job.state != JobState.RUNNING:
                    continue
                pid, start_time = job.pid, self.store.launch_info(job.id).pid_start_time
                if pid is None:
                    # The previous daemon died between marking and recording the pid.
                    pid = find_supervisor(self.launcher.job_dir(job.id) / "spec.json")
                    start_time = process_start_time(pid) if pid is not None else None
                    if pid is not None and start_time is not None:
                        self.store.set_pid(job.id, pid, start_time)
                if pid is not None and is_same_process(pid, start_time):
                    log.info("job %s still running (pid %s): re-adopted", job.id, pid)
                    self.launcher.watch(job.id, pid)
                    self.probe.note_job_started(pid, job.gpu_uuids, job.mem)
                else:
                    outcome = self.launcher.outcome(job.id)
                    # Died between marking the job running and its supervisor opening the
                    # log (no pid, no supervisor, no exit record, no log): the command never
                    # ran, so running it now cannot run it twice. Not after a reboot: the
                    # log's creation (and the pid, see Store) may have been lost with the
                    # page cache, so its absence proves nothing.
                    if (
                        outcome.kind == "lost"
                        and pid is None
                        and not rebooted
                        and not (job.log_path and os.path.lexists(job.log_path))
                        and self.store.unmark_running(job.id)
                    ):
                        log.info("job %s never started before the restart: queued again", job.id)
                        continue
                    if outcome.kind == "lost":
                        outcome = Outcome(
                            "lost",
                            message="its supervisor was gone when the daemon"
                            " restarted, with no exit status recorded",
                        )
                    self._settle(job.id, outcome)
