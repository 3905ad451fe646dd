"""Interactive jobs (`gpusched run`, `gpusched.claim()`): a reservation owned by a live
client process.

The client is the job: it runs the command itself, as its caller, in the caller's
terminal (or it is the notebook's own process), so nothing is launched for it. The
daemon knows it by the socket's peer credentials at the request: its pid and start time
are the job's `pid` and `pid_start_time`, which makes the client the root of the job's
process tree for the usage monitor. Each pass (`check_clients`, before planning), for
the clients on this server (in a cluster, each node checks its own):
- a client that is gone ends its job: `lost` (running) or `cancelled` (still waiting);
- a job past its --time, or found idle with `interactive.on_idle: end`, is asked to stop:
  SIGTERM to the client, which stops its command and reports how it ended;
- a client that has not ended its job `kill_grace` (plus a few polls) after being asked
  is SIGKILLed and its reservation ended, so an unwilling client cannot keep a card.
`hold_back_interactive` holds back interactive jobs beyond `interactive.max_per_user` (a
shared pass rule, for both placers); `observe_idle` flags
jobs that leave their GPU unused for `idle_timeout`; `finish` takes the client's report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter

from gpusched.config.settings import Config
from gpusched.core.errors import ConflictError
from gpusched.core.models import TERMINAL_STATES, EndReason, Job, JobState, StopIntent
from gpusched.core.sanitize import quoted
from gpusched.core.units import format_duration
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.processes.pidref import is_same_process
from gpusched.scheduling.admission import Admission
from gpusched.scheduling.context import Context
from gpusched.scheduling.endings import JobEndings
from gpusched.scheduling.idle_evidence import Evidence

log = logging.getLogger("gpusched.scheduler")

# Beyond kill_grace, how long a client asked to stop may take to report before the daemon
# ends its reservation itself (the client reports after its command has exited).
STOP_SLACK_S = 5.0


def signal_client(pid: int | None, start_time: str | None, signum: int) -> bool:
    """Send `signum` to the client if it is still the process that asked; False if gone."""
    if pid is None or not is_same_process(pid, start_time):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
    return True


class InteractiveJobs:
    """Held by the scheduler. The methods of each pass are called under the scheduler's
    lock; those of requests (`finish`, `wait_placed`) are not, and take it if they must."""

    def __init__(
        self,
        context: Context,
        endings: JobEndings,
        alive: Callable[[int, str | None], bool] = is_same_process,
    ) -> None:
        """The context's lock is taken by the requests (`finish`); its `wake`: a new pass."""
        self._config = context.settings
        self.jobs = context.store.jobs
        self.monitor = context.monitor
        self.endings = endings
        self.clock = context.clock
        self.alive = alive
        self._lock = context.lock
        self._wake = context.wake
        self._busy_at: dict[int, datetime] = {}  # job id -> last poll it used its GPU
        self._stop_sent_at: dict[int, datetime] = {}  # job id -> when it was asked to stop
        self.warnings: dict[int, str] = {}  # job id -> its warning in `status` (idle)
        # Notified after every pass: a client waiting for its placement looks again.
        self.placed = threading.Condition()
        # Idleness is counted from a job's start, but not from before this daemon's start:
        # what a job did meanwhile is unknown, so a restart must not make it idle at once.
        self._since = context.clock()
        # Whether a pass may skip reading the active interactive jobs (one read less per
        # pass on a server that runs none): `_news` counts the interactive jobs
        # submitted here (note_submitted), `_none_at` is its value before the last read
        # that found none with a client here (None: some may exist). Interactive jobs
        # are made only by a submit to the daemon their client talks to, this one; one
        # seen running (observe_idle) makes the next pass read again all the same.
        self._news = 0
        self._none_at: int | None = None

    @property
    def config(self) -> Config:
        return self._config.current

    # -- each pass ------------------------------------------------------------------------

    def check_clients(self) -> None:
        """End the jobs whose client is gone; stop those past their time; back stops up."""
        news = self._news
        if self._none_at == news:
            return  # none here at the last read, and none submitted since
        now = self.clock()
        # In a cluster, another server's client is no process here: its node checks it.
        active = [j for j in self.jobs.interactive_active() if self.endings.node.client_here(j)]
        self._none_at = None if active else news
        for job in active:
            info = self.jobs.launch_info(job.id)
            if job.pid is None or not self.alive(job.pid, info.pid_start_time):
                self._client_gone(job, info.stop_intent)
            elif job.state == JobState.RUNNING:
                self._enforce(job, info.stop_intent, info.pid_start_time, now)
        ids = {job.id for job in active}
        for table in (self._busy_at, self._stop_sent_at, self.warnings):
            for job_id in set(table) - ids:
                del table[job_id]

    def note_submitted(self) -> None:
        """An interactive job was just queued here (after its commit): the next pass
        checks the interactive jobs' clients again."""
        self._news += 1

    def _client_gone(self, job: Job, intent: StopIntent | None) -> None:
        who = f"its client process (pid {job.pid})"
        if job.state != JobState.RUNNING:
            self.endings.end(
                job.id,
                JobState.CANCELLED,
                EndReason.CANCELLED,
                detail=f"{who} exited before the job started",
                job=job,
            )
            return
        if intent is not None:  # it was asked to stop, and it has: the stop's own ending
            self.endings.settle(job.id, Outcome(OutcomeKind.CANCELLED))
            return
        message = f"{who} ended without reporting how its command ended"
        self.endings.settle(job.id, Outcome(OutcomeKind.LOST, message=message))

    def _enforce(
        self, job: Job, intent: StopIntent | None, start_time: str | None, now: datetime
    ) -> None:
        if intent is None and job.time_limit_s is not None and job.started_at is not None:
            ran_s = (now - datetime.fromisoformat(job.started_at)).total_seconds()
            if ran_s >= job.time_limit_s:
                limit = format_duration(job.time_limit_s, exact=True)
                self.stop(job, StopIntent.TIMEOUT, f"ran longer than its time limit of {limit}")
            return
        if intent is None:
            return
        asked = self._stop_sent_at.setdefault(job.id, now)  # after a restart: from now
        allowed = self.config.kill_grace_s + 2 * self.config.poll_interval_s + STOP_SLACK_S
        if (now - asked).total_seconds() >= allowed:
            log.warning(
                "job %s: its client (pid %s) did not stop within %.0fs of being asked: killed",
                job.id,
                job.pid,
                allowed,
            )
            signal_client(job.pid, start_time, signal.SIGKILL)
            self.endings.settle(job.id, Outcome(OutcomeKind.CANCELLED))

    def stop(self, job: Job, intent: StopIntent, detail: str) -> None:
        """Ask the client to stop its command (SIGTERM; it reports the end itself)."""
        self.jobs.set_stop_intent(job.id, intent, detail)
        self._stop_sent_at[job.id] = self.clock()
        start_time = self.jobs.launch_info(job.id).pid_start_time
        log.info("job %s: asking its client (pid %s) to stop: %s", job.id, job.pid, quoted(detail))
        if not signal_client(job.pid, start_time, signal.SIGTERM):
            self.endings.settle(job.id, Outcome(OutcomeKind.CANCELLED))

    def observe_idle(self, running: list[Job], evidence: Mapping[int, Evidence]) -> None:
        """Note which running interactive jobs use their GPU; warn about (or end) idle ones.

        Idle only on evidence (gpusched.scheduling.idle_evidence): the clock runs through
        QUIET polls since the last BUSY one; a poll that cannot tell (UNKNOWN) restarts it.
        """
        settings = self.config.interactive
        now = self.clock()
        for job in running:
            if not job.interactive:
                continue
            self._none_at = None  # one is running: the next pass checks its client
            seen = evidence.get(job.id, Evidence.UNKNOWN)
            if seen != Evidence.QUIET:
                self._busy_at[job.id] = now
                self.warnings.pop(job.id, None)
                continue
            started = datetime.fromisoformat(job.started_at) if job.started_at else now
            since = self._busy_at.setdefault(job.id, max(started, self._since))
            idle_s = (now - since).total_seconds()
            if settings.idle_timeout_s is None or idle_s < settings.idle_timeout_s:
                self.warnings.pop(job.id, None)
                continue
            limit = format_duration(settings.idle_timeout_s, exact=True)
            self.warnings[job.id] = (
                f"idle: no GPU use for {format_duration(idle_s)} (interactive.idle_timeout {limit})"
            )
            if settings.on_idle == "end" and self.jobs.launch_info(job.id).stop_intent is None:
                self.stop(job, StopIntent.IDLE, f"idle for {limit} (interactive.idle_timeout)")

    def notify_placed(self) -> None:
        with self.placed:
            self.placed.notify_all()

    # -- requests ---------------------------------------------------------------------------

    def finish(self, job: Job, exit_code: int | None, signum: int | None) -> Job:
        """The client's report: its command ended with `exit_code` or died of `signum`."""
        with self._lock:
            ended = self._finish(job, exit_code, signum)
        self._wake()
        return ended

    def _finish(self, job: Job, exit_code: int | None, signum: int | None) -> Job:
        current = self.jobs.get(job.id)
        if current.state in TERMINAL_STATES:
            return current  # already ended (e.g. the daemon gave up waiting for the report)
        if current.state != JobState.RUNNING:
            raise ConflictError(f"job {job.id} has not started")
        if signum is not None:
            killed = f"killed by {_signal_name(signum)}"
            outcome = Outcome(
                OutcomeKind.SIGNAL, exit_code=128 + signum, signal=signum, message=killed
            )
        else:
            outcome = Outcome(OutcomeKind.EXIT, exit_code=exit_code)
        if self.jobs.launch_info(job.id).stop_intent is not None:
            outcome = Outcome(OutcomeKind.CANCELLED, exit_code=outcome.exit_code)
        self.endings.settle(job.id, outcome)
        return self.jobs.get(job.id)

    def wait_placed(self, job_id: int, timeout_s: float) -> Job:
        """The job once it has started or ended, or as it is after `timeout_s`."""
        with self.placed:
            self.placed.wait_for(
                lambda: not self.jobs.get(job_id).state.is_waiting, timeout=timeout_s
            )
        return self.jobs.get(job_id)


def hold_back_interactive(admitted: Admission, holding: Sequence[Job], cap: int | None) -> None:
    """Hold back the interactive jobs beyond each user's `interactive.max_per_user` (`cap`):
    `holding` are the jobs that hold GPUs (running, and in a cluster placed). One of the
    shared pass rules (scheduling.pass_rules)."""
    if cap is None:
        return
    running_now = Counter(job.user for job in holding if job.interactive)
    taken = Counter(running_now)  # running, plus those let through in this pass
    first: dict[str, int] = {}  # the user's job let through first in this pass
    over: set[int] = set()
    candidates = list(filter(_interactive, admitted.eligible))  # a C loop: a long queue
    for queued in sorted(candidates, key=lambda q: (-q.priority, q.id)):
        user = queued.user
        if taken[user] < cap:
            taken[user] += 1
            first.setdefault(user, queued.id)
            continue
        over.add(queued.id)
        if running_now[user] >= cap:
            why = f"{user} has {running_now[user]} running"
        else:
            why = f"{user}'s interactive job {first[user]} goes first"
        admitted.waiting_reasons[queued.id] = (
            f"interactive limit: {why} (interactive.max_per_user {cap})"
        )
    if over:  # else the same sequence: what a pass keeps of an unchanged queue still holds
        admitted.eligible = [q for q in admitted.eligible if q.id not in over]


_interactive = attrgetter("interactive")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
