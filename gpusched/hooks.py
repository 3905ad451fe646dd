"""Notification hooks: a command run as the job's owner when the job ends.

Two sources, both run for every ending (done, failed, cancelled, lost...):

- `on_finish:` in the config (the administrator's, e.g. a mail or chat script);
- `gpusched submit --notify CMD` (the job's owner's), stored with the job.

Each runs as the job's owner (uid, gid, supplementary groups, umask, the submitter's
environment plus the job's GPUSCHED_* variables) in the job's working directory, with the
job's JSON object on stdin. A command is an argv list; the CLI splits `--notify` with
shlex, so no shell sees it unless the user wrote `sh -c '...'` themselves.

Hooks never hold up scheduling: `Scheduler._end` only hands the job id to a small thread
pool, outside any database transaction and without waiting. A hook that fails is
logged; one that runs past `hook_timeout` is killed (its whole process group) and
logged.

Nothing is lost across a restart: a job's end records in the same transaction that its
hooks are due, and the mark is cleared just before they start. A daemon that stops (or
dies) before a job's hooks start runs them at its next start (`resume`); hooks already
running finish on their own (each in its own session) and are not started again. Only a
power cut can make a job's hooks run twice (see gpusched.store_db's docstring).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpusched.config import Config
from gpusched.errors import GpuschedError
from gpusched.launcher import job_environment
from gpusched.models import Job
from gpusched.sanitize import command_for_log, quoted
from gpusched.store import Store
from gpusched.supervisor import owner_credentials

log = logging.getLogger("gpusched.hooks")

MAX_WORKERS = 4
OUTPUT_TAIL_BYTES = 2000


@dataclass(frozen=True)
class HookResult:
    kind: str  # exit | timeout | failed_to_start
    exit_code: int | None = None
    output: str = ""  # the end of what the hook printed (stdout and stderr)


def _cwd_for(job: Job) -> str:
    """The job's directory if it still exists, else the owner's home, else /."""
    if os.path.isdir(job.cwd):
        return job.cwd
    with contextlib.suppress(KeyError):
        home = pwd.getpwuid(job.uid).pw_dir
        if os.path.isdir(home):
            return home
    return "/"


def run_hook(
    argv: Sequence[str],
    job_json: dict[str, Any],
    *,
    env: dict[str, str],
    cwd: str,
    uid: int,
    gid: int,
    umask: int,
    timeout_s: float,
) -> HookResult:
    """Run one hook to its end or its timeout; never raises for the hook's own failures."""
    groups = []
    if os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    stdin = (json.dumps(job_json) + "\n").encode()
    # Output goes to an unnamed file, not a pipe: a chatty hook can neither fill a pipe
    # and stall nor make the daemon buffer its output in memory.
    with tempfile.TemporaryFile() as output:
        try:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=output,
                umask=umask,
                # Its own session: on timeout the whole group it started is killed.
                start_new_session=True,
                close_fds=True,
                **owner_credentials(uid, gid, groups),
            )
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return HookResult("failed_to_start", output=str(exc))
        try:
            # communicate() feeds stdin without blocking on a hook that never reads it.
            process.communicate(stdin, timeout=timeout_s)
            result = HookResult("exit", process.returncode)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.kill()
            process.wait()
            result = HookResult("timeout", process.returncode)
        output.seek(max(0, output.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
        tail = output.read().decode(errors="replace").strip()
    return HookResult(result.kind, result.exit_code, tail)


class HookRunner:
    """Runs the hooks of ended jobs in a few background threads."""

    def __init__(
        self, store: Store, config: Callable[[], Config], max_workers: int = MAX_WORKERS
    ) -> None:
        self.store = store
        self._config = config  # read at each run: a SIGHUP reload applies to the next hook
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hook")
        self._lock = threading.Lock()
        self._closed = False

    def job_ended(self, job_id: int, hooks_due: bool) -> None:
        """Queue the hooks of a job that just ended, if it has any. Returns at once."""
        if hooks_due:
            self._queue(job_id)

    def resume(self) -> None:
        """Queue the hooks that were due when the daemon last stopped (call at start-up)."""
        due = self.store.hooks_due()
        if due:
            log.info("running the notification hooks of %d job(s) that ended before", len(due))
        for job_id in due:
            self._queue(job_id)

    def _queue(self, job_id: int) -> None:
        with self._lock:
            if not self._closed:
                self._pool.submit(self._run_all, job_id)

    def _run_all(self, job_id: int) -> None:
        try:
            config = self._config()
            self.store.hooks_started(job_id)
            job = self.store.get(job_id)
            commands = [("on_finish", config.on_finish), ("notify", job.notify)]
            if not any(argv for _, argv in commands):
                return  # on_finish was removed from the config since the job ended
            info = self.store.launch_info(job_id)
            env = job_environment(
                job, info.env, job.gpu_indices, job.gpu_uuids, config.visible_devices
            )
            env.update(
                GPUSCHED_JOB_STATE=str(job.state),
                GPUSCHED_JOB_REASON=job.reason or "",
                GPUSCHED_EXIT_CODE="" if job.exit_code is None else str(job.exit_code),
            )
            for source, argv in commands:
                if not argv:
                    continue
                result = run_hook(
                    argv,
                    job.to_json(),
                    env=env,
                    cwd=_cwd_for(job),
                    uid=job.uid,
                    gid=info.gid,
                    umask=info.umask,
                    timeout_s=config.hook_timeout_s,
                )
                _log_result(job, source, argv, result, config.hook_timeout_s)
        except GpuschedError as exc:
            log.warning("hooks of job %s not run: %s", job_id, exc.message)
        except Exception:  # a bug here must cost one notification, never a pool thread
            log.exception("hooks of job %s failed", job_id)

    def close(self) -> None:
        """Leave the hooks not yet started to the next start; running ones end by themselves
        (or at their timeout)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _log_result(
    job: Job, source: str, argv: Sequence[str], result: HookResult, timeout_s: float
) -> None:
    # The program's name only (a --notify command is the user's, as private as the job's),
    # and the hook's output quoted: neither can forge a line of the log.
    what = f"{source} hook of job {job.id} ({command_for_log(list(argv), False)})"
    tail = f": {quoted(result.output, 500)}" if result.output else ""
    if result.kind == "timeout":
        log.warning("%s still running after %gs: killed%s", what, timeout_s, tail)
    elif result.kind == "failed_to_start":
        log.warning("%s could not start%s", what, tail)
    elif result.exit_code != 0:
        log.warning("%s exited %s%s", what, result.exit_code, tail)
    else:
        log.info("%s ran", what)
