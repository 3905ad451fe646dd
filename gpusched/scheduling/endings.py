"""How jobs end.

`JobEndings` turns a supervisor's outcome into a job's final state (exit, signal, cancel,
overrun, timeout, failed start, out of memory, lost), records what the job used, queues
an OOM retry and tells whoever waits for endings. Built once on the pass's context
(scheduling.context) and an ownership strategy (scheduling.ownership: which rows are
this daemon's, and the guard its end writes carry); it reaches processes only through
the launcher's interface (gpusched.processes.launching), so tests drive it in memory.
Which state and reason each outcome means is scheduling.outcome_states's; what a
restarted daemon makes of the jobs it finds running (a claim to verify, settled here),
scheduling.adoption's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from gpusched.config.settings import Config
from gpusched.core.clock import iso
from gpusched.core.hints import cores_hint
from gpusched.core.models import (
    TERMINAL_STATES,
    EndReason,
    GpuHealth,
    GpuState,
    Job,
    JobState,
    StopIntent,
)
from gpusched.core.sanitize import quoted
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.context import Context
from gpusched.scheduling.host_limits import job_limits
from gpusched.scheduling.outcome_states import (
    ENDINGS,
    LOGGED_DETAILS,
    STOPPED_FOR,
    legacy_stop_intent,
    outcome_words,
)
from gpusched.scheduling.ownership import Ownership
from gpusched.scheduling.policy_inputs import capacity_bytes
from gpusched.scheduling.ratelog import RateLimitedLog
from gpusched.store import TimelineWrite
from gpusched.usage.ending import OomCause, final_usage, oom_cause
from gpusched.usage.oom import retry_mem

log = logging.getLogger("gpusched.scheduler")

# How many of the latest ended job ids a waiter can catch up from without a read.
RECENT_ENDS = 1024


class JobEndings:
    def __init__(
        self, context: Context, node: Ownership, gpus: Callable[[], list[GpuState]]
    ) -> None:
        """`node`: which running jobs are this daemon's (scheduling.ownership). `gpus`:
        the latest GPU reading. The context's lock is taken for an ending that comes
        from the launcher's thread; its end listeners are told of each end."""
        self._config = context.settings
        self.jobs, self.usage = context.store.jobs, context.store.usage
        self.attempts = context.store.attempts  # the end of a requeued run
        self.probe = context.probe
        self.launcher = context.launcher
        self.monitor = context.monitor
        self.clock = context.clock
        self._lock = context.lock
        self._gpus = gpus
        self._wake = context.wake
        self.node = node
        self.trouble = RateLimitedLog(log)  # a start refused every pass: said once a minute
        self.end_listeners = context.end_listeners
        self.ended = threading.Condition()
        # Ids of the latest ended jobs and how many ended in all (under `ended`): a
        # waiter re-reads the database only when one of its own jobs may have ended.
        self._recent_ends: deque[int] = deque(maxlen=RECENT_ENDS)
        self._end_count = 0
        # Jobs whose supervisor exited while their end could not be written (the database
        # was away): their outcome stays in the exit record, and each tick tries again.
        self.unsettled: set[int] = set()

    @property
    def config(self) -> Config:
        return self._config.current  # read at each use: a reload reaches the next ending

    def end(
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
        run_s: float | None = None,
        measured: Outcome | None = None,
    ) -> bool:
        """`durable=False`: the ending comes from the supervisor's exit record (Store).

        `job`: its row if the caller has just read it (under the lock), else it is read.
        `run_s`: how long it ran, as its supervisor measured (Outcome.run_s);
        `measured`: its outcome, for what it used of the host (host_peak, cpu_s).
        """
        now = iso(self.clock())
        if run_s is None and measured is not None:
            run_s = measured.run_s
        job = job or self.jobs.get(job_id)
        hooks_due = bool(self.config.on_finish or job.notify)
        ended = self.jobs.mark_ended(
            job_id,
            state=state,
            reason=str(reason),
            now=now,
            exit_code=exit_code,
            detail=detail,
            usage=_with_host_used(
                self._final_usage(
                    job, state, reason, now, (retry, retry_refused, oom_next_mem), run_s=run_s
                ),
                measured,
                self._cores_of(job) if measured is not None and measured.cpu_s else None,
            ),
            timeline=self._final_timeline(job_id),
            hooks_due=hooks_due,
            durable=durable,
            guard=self.node.guard_for(job_id),
        )
        if ended:
            # A failed start names the program's path, an OOM end quotes the job's output
            # (secrets included): only gpusched's own words are logged unless show_commands.
            shown = detail if self.config.show_commands or reason in LOGGED_DETAILS else None
            why = f": {quoted(shown, 500)}" if shown else ""  # may quote a user's path
            log.info("job %s %s (%s)%s", job_id, state, reason, why)
            self.announce_ends([(job_id, hooks_due)])
            confined = job.ram is not None or job.cpus is not None or self.launcher.fences_devices
            if job.interactive and confined:
                self.launcher.release_client(job_id)
        return ended

    def announce_ends(self, ended: list[tuple[int, bool]]) -> None:
        """Tell waiters and end listeners that these jobs have ended (after the commit):
        (job id, whether it has notification hooks to run) for each."""
        if not ended:
            return
        with self.ended:
            self._recent_ends.extend(job_id for job_id, _ in ended)
            self._end_count += len(ended)
            self.ended.notify_all()
        for job_id, hooks_due in ended:
            self.node.ended(job_id)
            for listener in self.end_listeners:
                try:
                    listener(job_id, hooks_due)
                except Exception:  # a listener's bug must not undo the job's ending
                    log.exception("end listener failed for job %s", job_id)

    def _cores_of(self, job: Job) -> int | None:
        """The cores the job ran on: its cpuset's (its --cpus, else its GPUs' share), else
        every core the daemon may give."""
        facts = self.launcher.host_facts()
        return job_limits(job, facts, self.config).cpus or len(facts.cores) or None

    def _final_usage(
        self,
        job: Job,
        state: JobState,
        reason: EndReason,
        now: str,
        oom: tuple[Job | None, str | None, int | None],
        *,
        run_s: float | None = None,
    ) -> dict[str, object] | None:
        """A job's measured figures and hints at its end (None for a job that never ran).

        `oom`, after an out-of-memory end: its retry, why there is none although one was
        asked for, and the --mem a retry takes.
        """
        try:
            if job.started_at is None:
                return None
            totals = [g.total_bytes for g in self._gpus() if g.uuid in job.gpu_uuids]
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
                run_s=run_s,
            )
        except Exception:  # the figures must never keep a job from ending
            log.exception("summing up the usage of job %s failed", job.id)
            return None

    def _final_timeline(self, job_id: int) -> TimelineWrite | None:
        """The last points of a job's time series, written with its end."""
        try:
            return self.monitor.final_timeline(job_id)
        except Exception:  # the series must never keep a job from ending
            log.exception("closing the timeline of job %s failed", job_id)
            return None

    def _end_oom(self, job: Job, outcome: Outcome, oom: OomCause, durable: bool) -> None:
        """End a job that ran out of GPU memory; queue its retry if it asked for one: with
        more memory, or its own --mem where a process gpusched did not start filled the
        card (the room was promised to it: it waits until there is room again)."""
        cause = oom.text
        if oom.by_other:
            mem, why_not = job.mem, ""
        else:
            usable = [capacity_bytes(g) for g in self._gpus() if g.health != GpuHealth.EXCLUDED]
            limit = self.config.limits_for(job.user).max_mem_bytes
            mem, why_not = retry_mem(job.mem, job.gpus, usable, self.config.headroom_bytes, limit)
        retry = self.usage.add_retry(job.id, mem) if mem is not None and job.retry_oom else None
        if retry is None and job.retry_oom:
            cause = f"{cause}; not retried: {why_not}"
        if retry is not None:
            log.info("job %s ran out of GPU memory: retried as job %s", job.id, retry.id)
            self._wake()
        self.end(
            job.id,
            JobState.FAILED,
            EndReason.OOM,
            job=job,
            exit_code=outcome.exit_code,
            detail=cause,
            retry=retry,
            retry_refused=why_not if retry is None and (job.retry_oom or mem is None) else None,
            oom_next_mem=mem,
            durable=durable,
            run_s=outcome.run_s,
            measured=outcome,
        )

    def on_job_exit(self, job_id: int) -> None:
        """Called by the launcher's watcher thread when a job's supervisor exits."""
        with self._lock:
            if self._runs_on(job_id):
                return
            try:
                # Not fsynced: the outcome stays on disk in the exit record (see Store).
                self.settle(job_id, self.launcher.outcome(job_id), durable=False)
            except Exception as exc:  # the database is away: the next tick records it
                self.unsettled.add(job_id)
                self.trouble.warning(
                    "settle", f"job {job_id} ended; its end is recorded once it can be: {exc}"
                )
        self._wake()

    def _runs_on(self, job_id: int) -> bool:
        """Whether the exit heard is an earlier run's: the process this node keeps for
        the job's current run still lives. A frozen daemon's watcher may report a run's
        exit only after the job, queued again, was started again here; the exit record
        read now is the new run's, and settling it would end that run `lost`."""
        current = self.node.process_of(job_id)
        if current is None or not self.launcher.is_running(*current):
            return False
        log.info("job %s: an earlier run's exit heard; its run here goes on", job_id)
        return True

    def _requeued_run_ended(self, job: Job, outcome: Outcome) -> None:
        """This node's run of a job the cluster queued again (its node declared down)
        ended: said on that run's attempt, and, if it exited by itself before the job
        started again, recorded as the job's end (not run a second time)."""
        words = outcome_words(outcome)
        exit_code = outcome.exit_code if outcome.kind == OutcomeKind.EXIT else None
        hooks = self.attempts.requeued_run_ended(job.id, self.node.name, words, exit_code)
        if hooks is not None:
            log.info("job %s, queued again, had ended on this node: %s", job.id, words)
            self.announce_ends([(job.id, hooks)])

    def settle_unsettled(self) -> None:
        """Record the ends that could not be written when they happened (under the lock)."""
        for job_id in sorted(self.unsettled):
            self.settle(job_id, self.launcher.outcome(job_id), durable=False)
            self.unsettled.discard(job_id)
            log.info("job %s: its end is recorded now that the database is back", job_id)

    def settle(self, job_id: int, outcome: Outcome, *, durable: bool = True) -> None:
        """End a running job as its supervisor's `outcome` says, read with why it was stopped."""
        job, intent = self.jobs.job_and_stop_intent(job_id)  # one read: at every job's end
        lost_with_node = job.state == JobState.LOST and job.reason == EndReason.NODE_LOST
        waiting = job.state in (JobState.QUEUED, JobState.HELD)
        elsewhere = job.state == JobState.RUNNING and not self.node.owns(job)
        if job.requeue and self.node.name and (waiting or elsewhere):
            self._requeued_run_ended(job, outcome)  # (cluster) a run its node lost, requeued
            return
        if not (job.state == JobState.RUNNING or lost_with_node) or not self.node.owns(job):
            return  # ended already, or (cluster) not this node's: its end is not ours
        detail = job.reason_detail
        if intent is None:
            intent, detail = legacy_stop_intent(detail)
        if (
            outcome.kind == OutcomeKind.FAILED_TO_START
            and outcome.transient
            and intent is None
            and self.jobs.unmark_running(job_id)
        ):
            # Its supervisor could not fork the command for want of tasks or memory (one
            # user's job filled the service's limits): another user's job must not fail of
            # it; it waits in the queue and the next pass tries again.
            self.trouble.warning("start", f"job {job_id} could not start yet: {outcome.message}")
            self._wake()
            return
        if outcome.kind == OutcomeKind.LOST and intent == StopIntent.CANCEL:
            # A cancel that reached the supervisor before it set up its SIGTERM handler
            # killed it outright; it sets the handler before starting the job, so the job
            # never started: the cancel simply won.
            outcome = Outcome(OutcomeKind.CANCELLED)
        if outcome.kind == OutcomeKind.CANCELLED and intent in STOPPED_FOR:
            state, reason = STOPPED_FOR[intent]
            self.end(
                job_id,
                state,
                reason,
                exit_code=outcome.exit_code,
                detail=detail,
                durable=durable,
                job=job,
                measured=outcome,
            )
            return
        if outcome.kind == OutcomeKind.SIGNAL or (
            outcome.kind == OutcomeKind.EXIT and outcome.exit_code != 0
        ):
            # The tracker is in memory, or after a restart in the database (a minute old).
            cause = oom_cause(job, self.monitor.tracker(job), self.config.headroom_bytes)
            if cause is not None:
                self._end_oom(job, outcome, cause, durable)
                return
        if outcome.kind == OutcomeKind.EXIT:
            state = JobState.DONE if outcome.exit_code == 0 else JobState.FAILED
            self.end(
                job_id,
                state,
                EndReason.EXIT,
                exit_code=outcome.exit_code,
                durable=durable,
                job=job,
                measured=outcome,
            )
            return
        state, reason = ENDINGS.get(outcome.kind, (JobState.LOST, EndReason.LOST))
        message = outcome.message
        if reason == EndReason.CANCELLED:
            message = detail or "cancelled"  # who cancelled it, noted at the request
        self.end(
            job_id,
            state,
            reason,
            exit_code=outcome.exit_code,
            detail=message,
            durable=durable,
            job=job,
            measured=outcome,
        )

    def wait_until_ended(self, job_ids: list[int], timeout_s: float) -> None:
        """Block until every job has ended or the timeout passes (reads their states only:
        a `wait` on 10,000 jobs must not hold 10,000 rows while it waits)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self.ended:
            # Every ending goes through end(), which records it under this condition after
            # its commit: an end is either seen by this read or recorded while we wait.
            seen = self._end_count
            pending = self._active(job_ids)
            while pending and (remaining := deadline - time.monotonic()) > 0:
                # In a cluster another daemon may record the end: read again each second.
                notified = self.ended.wait(min(remaining, self.node.recheck_s or remaining))
                new = self._end_count - seen
                seen = self._end_count
                if new > len(self._recent_ends) or not notified:  # read again
                    pending = self._active(pending)
                elif new:
                    pending.difference_update(list(self._recent_ends)[-new:])

    def _active(self, job_ids: Iterable[int]) -> set[int]:
        return {
            i for i, state in self.jobs.states_of(job_ids).items() if state not in TERMINAL_STATES
        }


def _with_host_used(
    usage: dict[str, object] | None, measured: Outcome | None, cores: int | None = None
) -> dict[str, object] | None:
    """A job's end figures with what its supervisor measured of the host, where it did,
    and the hint for cores busy throughout while its GPU waited (`cores`: how many it
    had)."""
    if measured is None or (measured.host_peak_bytes is None and measured.cpu_s is None):
        return usage
    found = {"host_peak": measured.host_peak_bytes, "cpu_s": measured.cpu_s}
    values = {**(usage or {}), **{k: v for k, v in found.items() if v is not None}}
    util = values.get("mean_util")
    hints = values.get("hints")
    said = cores_hint(
        measured.cpu_s, measured.run_s, cores, util if isinstance(util, (int, float)) else None
    )
    if said is not None and isinstance(hints, list):
        values["hints"] = [*hints, said]
    return values
