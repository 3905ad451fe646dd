"""Notification hooks: a command run as the job's owner when the job ends.

Two sources, both run for every ending (done, failed, cancelled, lost...):

- `on_finish:` in the config (the administrator's, e.g. a mail or chat script);
- `gpusched submit --notify CMD` (the job's owner's), stored with the job.

Each runs as the job's owner (uid, gid, supplementary groups, umask) in the job's working
directory (entered as the owner: see gpusched.daemon.hookrun), with the job's JSON on stdin. The
owner's `--notify` hook gets the submitter's environment plus the job's GPUSCHED_*
variables; the administrator's `on_finish` gets a fixed one (a fixed PATH, the owner's
HOME, LANG=C.UTF-8 and the GPUSCHED_* variables), never what the owner submitted. A
command is an argv list; the CLI splits `--notify` with shlex, so no shell sees it unless
the user wrote `sh -c '...'` themselves.

Hooks never hold up scheduling: an ending (`JobEndings.end`) only hands the job id over, outside any
database transaction and without waiting. Fair to users: at most `hooks_per_user` jobs'
hooks of one owner run at once and `hooks_total` in all; a free slot goes to the next
owner in turn (round robin), so one user's many slow hooks delay only their own. A hook
that fails is logged; one that runs past `hook_timeout` is killed and logged. Each hook
runs in a cgroup of its own (gpusched.daemon.hookrun): at its end or its timeout, every
process it left, even in a session of its own, is killed. How the owner's `--notify` hook
ended (its exit status and the end of its output) is also recorded on the job, for `show`
and the dashboard.

Nothing is lost across a restart: a job's end records in the same transaction that its
hooks are due, and the mark is cleared just before they start. A daemon that stops (or
dies) before a job's hooks start runs them at its next start (`resume`); hooks already
running finish on their own (each in its own session) and are not started again. (A
stopping daemon waits for them; if it is killed, their output pipe goes with it, so a
hook that still writes then ends by SIGPIPE.) Only a
power cut can make a job's hooks run twice (see gpusched.store.database's docstring).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from gpusched.config.settings import Config
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job
from gpusched.core.sanitize import command_for_log, quoted
from gpusched.daemon.hookrun import HookResult, HookResultKind, admin_environment, run_hook
from gpusched.processes.environment import job_environment
from gpusched.store import Jobs

__all__ = ["HookRunner", "run_hook"]

log = logging.getLogger("gpusched.hooks")

NOTIFY_OUTPUT_CHARS = 500  # the end of a --notify hook's output kept on the job
UNKNOWN_OWNER = -1  # a job whose row could not be read: its hooks queue on their own


class HookRunner:
    """Runs the hooks of ended jobs in background threads, fairly between owners.

    A small dispatcher thread learns each job's owner (a database read, which must not
    happen under the scheduler's lock where `job_ended` is called) and files the job
    under them; a job's hooks then run in a thread of their own once its owner and the
    total are under their limits. Those threads are not daemon threads: a stopping
    daemon lets the running hooks finish (each ends at `hook_timeout` at the latest).
    """

    def __init__(self, jobs: Jobs, config: Callable[[], Config]) -> None:
        self.jobs = jobs
        self._config = config  # read at each decision: a SIGHUP reload applies to the next
        self._cond = threading.Condition()
        self._intake: deque[int] = deque()  # ended jobs whose owner is not looked up yet
        self._waiting: dict[int, deque[int]] = {}  # owner uid -> their jobs, in end order
        self._turns: deque[int] = deque()  # owners with waiting jobs, next one first
        self._running: Counter[int] = Counter()  # owner uid -> jobs whose hooks run
        self._closed = False
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="hook-dispatch", daemon=True
        )
        self._dispatcher.start()

    def job_ended(self, job_id: int, hooks_due: bool) -> None:
        """Queue the hooks of a job that just ended, if it has any. Returns at once."""
        if hooks_due:
            self._queue([job_id])

    def resume(self) -> None:
        """Queue the hooks that were due when the daemon last stopped (call at start-up)."""
        due = self.jobs.hooks_due()
        if due:
            log.info("running the notification hooks of %d job(s) that ended before", len(due))
        self._queue(due)

    def _queue(self, job_ids: Sequence[int]) -> None:
        with self._cond:
            if not self._closed:
                self._intake.extend(job_ids)
                self._cond.notify_all()

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                while not self._intake and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                new = list(self._intake)
                self._intake.clear()
            owners = [(job_id, self._owner(job_id)) for job_id in new]
            with self._cond:
                for job_id, uid in owners:
                    if uid not in self._waiting:
                        self._waiting[uid] = deque()
                        self._turns.append(uid)
                    self._waiting[uid].append(job_id)
                self._start_ready()

    def _owner(self, job_id: int) -> int:
        try:
            return self.jobs.get(job_id).uid
        except Exception:  # its hooks' own run says what is wrong with the job
            return UNKNOWN_OWNER

    def _start_ready(self) -> None:
        """Start the hooks of every job that may start now (with `_cond` held)."""
        if self._closed:
            return
        config = self._config()
        started = True
        while started:  # rounds: each owner in turn starts at most one job's hooks a round
            started = False
            for _ in range(len(self._turns)):
                if sum(self._running.values()) >= config.hooks_total:
                    return
                uid = self._turns.popleft()
                if self._running[uid] >= config.hooks_per_user:
                    self._turns.append(uid)  # their turn comes when one of theirs ends
                    continue
                job_id = self._waiting[uid].popleft()
                if self._waiting[uid]:
                    self._turns.append(uid)
                else:
                    del self._waiting[uid]
                self._running[uid] += 1
                started = True
                threading.Thread(
                    target=self._run, args=(job_id, uid), name=f"hook-{job_id}", daemon=False
                ).start()

    def _run(self, job_id: int, uid: int) -> None:
        try:
            self._run_all(job_id)
        finally:
            with self._cond:
                self._running[uid] -= 1
                if not self._running[uid]:
                    del self._running[uid]
                self._start_ready()

    def _run_all(self, job_id: int) -> None:
        try:
            config = self._config()
            self.jobs.hooks_started(job_id)
            job = self.jobs.get(job_id)
            commands = [("on_finish", config.on_finish), ("notify", job.notify)]
            if not any(argv for _, argv in commands):
                return  # on_finish was removed from the config since the job ended
            info = self.jobs.launch_info(job_id)
            ending = {
                "GPUSCHED_JOB_STATE": str(job.state),
                "GPUSCHED_JOB_REASON": job.reason or "",
                "GPUSCHED_EXIT_CODE": "" if job.exit_code is None else str(job.exit_code),
            }
            ours = job_environment(job, {}, job.gpu_indices, job.gpu_uuids, config.visible_devices)
            variables = {k: v for k, v in ours.items() if k.startswith("GPUSCHED_")} | ending
            owners = job_environment(
                job, info.env, job.gpu_indices, job.gpu_uuids, config.visible_devices
            )
            envs = {"on_finish": admin_environment(job.uid, variables), "notify": owners | ending}
            for source, argv in commands:
                if not argv:
                    continue
                result = run_hook(
                    argv,
                    job.to_json(),
                    env=envs[source],
                    cwd=job.cwd,
                    uid=job.uid,
                    gid=info.gid,
                    umask=info.umask,
                    timeout_s=config.hook_timeout_s,
                    output_path=config.state_dir / "hooks" / f"{job_id}.{source}.out",
                    output_max_bytes=config.hook_output_max_bytes,
                )
                _log_result(job, source, argv, result, config)
                if source == "notify":  # the owner's hook: how it ended is theirs to see
                    self.jobs.set_notify_result(job_id, notify_result(result))
        except GpuschedError as exc:
            log.warning("hooks of job %s not run: %s", job_id, exc.message)
        except Exception:  # a bug here must cost one notification, never a thread
            log.exception("hooks of job %s failed", job_id)

    def close(self) -> None:
        """Leave the hooks not yet started to the next start; running ones end by themselves
        (or at their timeout)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def notify_result(result: HookResult) -> dict[str, Any]:
    """What `show` and the dashboard say of a `--notify` hook: how it ended and the end of
    its output (at most NOTIFY_OUTPUT_CHARS characters)."""
    output = result.output[-NOTIFY_OUTPUT_CHARS:]
    return {"kind": str(result.kind), "exit_code": result.exit_code, "output": output}


def _log_result(
    job: Job, source: str, argv: Sequence[str], result: HookResult, config: Config
) -> None:
    # The program's name only (a --notify command is the user's, as private as the job's),
    # and the hook's output quoted: neither can forge a line of the log.
    what = f"{source} hook of job {job.id} ({command_for_log(list(argv), False)})"
    cut = f" (output cut at hook_output_max, {config.hook_output_max_bytes} bytes)"
    tail = (cut if result.cut else "") + (
        f": {quoted(result.output, 500)}" if result.output else ""
    )
    if result.kind is HookResultKind.TIMEOUT:
        log.warning("%s still running after %gs: killed%s", what, config.hook_timeout_s, tail)
    elif result.kind is HookResultKind.FAILED_TO_START:
        log.warning("%s could not start%s", what, tail)
    elif result.exit_code != 0:
        log.warning("%s exited %s%s", what, result.exit_code, tail)
    else:
        log.info("%s ran%s", what, cut if result.cut else "")
