"""The daemon's retention pass: run every `retention.every`, it deletes what ended jobs
leave once it is old enough (gpusched.store.retention for the database), unlinks the
logs that expired, and removes each ended job's directory under `state_dir/jobs`.

A job's directory (its supervisor's identity and exit record; the spec, with the job's
environment, is deleted by the supervisor as soon as it has read it) goes once the
job's end is recorded from that exit record and made durable (`checkpoint`), and only
for jobs ended at least DIR_GRACE_S ago. A job ended `lost` or `node_lost` keeps its
directory: a supervisor still running elsewhere, or a restarted daemon, may yet need the
exit record to settle it (docs/operations.md, "Retention").

`gpusched admin prune --ended-before AGE [--dry-run]` runs this same pass at once with
`history` alone set to AGE (`prune_history`): one implementation, so both keep the jobs
an active job waits for and those whose hooks are due, and remove the same files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gpusched.config.holder import ConfigHolder
from gpusched.config.retention import RetentionSettings
from gpusched.core.clock import iso
from gpusched.core.models import TERMINAL_STATES, EndReason
from gpusched.core.requests.replies import PruneReply
from gpusched.processes.launcher import Launcher
from gpusched.store import Database, Jobs
from gpusched.store.retention import Pruned, checkpoint, prune

log = logging.getLogger("gpusched.retention")

DIR_GRACE_S = 5.0  # PostgreSQL's WAL writer flushes asynchronous commits within 0.6 s
_KEEP_DIR_REASONS = frozenset({str(EndReason.LOST), str(EndReason.NODE_LOST)})


@dataclass(frozen=True)
class PruneReport:
    """`gpusched admin prune`'s answer."""

    jobs: int  # rows deleted (with dry_run: that would be)
    log_bytes: int  # the size of the logs removed (or that would be)
    cutoff: str  # jobs that ended before this time (ISO, UTC)

    def to_json(self) -> PruneReply:
        # `more`: always false now (the pass works through every batch); older clients
        # ask again while it is true.
        return {
            "jobs": self.jobs,
            "log_bytes": self.log_bytes,
            "more": False,
            "cutoff": self.cutoff,
        }


class RetentionPass:
    def __init__(
        self, settings: ConfigHolder, database: Database, jobs: Jobs, launcher: Launcher
    ) -> None:
        self._settings = settings
        self.database, self.jobs = database, jobs
        self.launcher = launcher

    def retention_pass(self) -> None:
        """One pass, from the daemon's background scheduler (a failure is logged there)."""
        self.run()

    def run(self, now: float | None = None) -> Pruned:
        """One pass as of `now` (epoch seconds); returns what the database lost."""
        now = time.time() if now is None else now
        return self._apply(self._settings.current.retention, now)[0]

    def prune_history(
        self, ended_before_s: float, *, dry_run: bool = False, now: float | None = None
    ) -> PruneReport:
        """`gpusched admin prune`: this pass, now, with `history` alone set to
        `ended_before_s` (the other keys are the config's business, at its own pace)."""
        now = time.time() if now is None else now
        only_history = RetentionSettings(
            history_s=ended_before_s, environments_s=None, timelines_s=None, logs_s=None
        )
        done, log_bytes = self._apply(only_history, now, dry_run=dry_run)
        cutoff = iso(datetime.fromtimestamp(now - ended_before_s, timezone.utc))
        return PruneReport(done.jobs, log_bytes, cutoff)

    def _apply(
        self, settings: RetentionSettings, now: float, *, dry_run: bool = False
    ) -> tuple[Pruned, int]:
        """Prune the database by `settings`, then the files: what the database lost and
        the bytes of logs removed (with `dry_run`: counted, nothing removed)."""
        log_dir = self._settings.current.log_dir
        done = prune(self.database, settings, now, dry_run=dry_run)
        if dry_run:
            return done, sum(_own_log_size(Path(path), log_dir) for path in done.logs)
        sizes = [_unlink_log(Path(path), log_dir) for path in done.logs]
        removed_logs = sum(size is not None for size in sizes)
        dirs = self.remove_job_dirs(now)
        if done or dirs:
            log.info(
                "retention: %s ended job(s), %s timeline(s), %s environment(s) (%s stored)"
                " deleted; %s log(s), %s job dir(s) removed",
                done.jobs,
                done.timelines,
                done.environments,
                done.stored_environments,
                removed_logs,
                dirs,
            )
        return done, sum(size or 0 for size in sizes)

    def remove_job_dirs(self, now: float) -> int:
        """Remove the directories of jobs whose end is recorded from their exit record."""
        ids = self.launcher.job_ids()
        if not ids:
            return 0
        checkpoint(self.database)
        found = self.jobs.get_many(ids)
        removed = 0
        for job_id in ids:
            job = found.get(job_id)
            if job is not None:
                if job.state not in TERMINAL_STATES or job.reason in _KEEP_DIR_REASONS:
                    continue
                if job.ended_at is None or _epoch(job.ended_at) > now - DIR_GRACE_S:
                    continue
            # No row: deleted by `history` (it ended long ago), or never ours to keep.
            self.launcher.forget(job_id)
            removed += 1
        return removed


def _epoch(moment: str) -> float:
    return datetime.fromisoformat(moment).timestamp()


def _own_log_size(path: Path, log_dir: Path) -> int:
    """The size of a job's log if it is one of ours (a file directly in `log_dir`), else 0."""
    if path.parent != log_dir:
        return 0
    try:
        found = path.lstat()
    except OSError:
        return 0
    return found.st_size if stat.S_ISREG(found.st_mode) else 0


def _unlink_log(path: Path, log_dir: Path) -> int | None:
    """Unlink a job's log, only if it is one of ours (a file directly in `log_dir`, not a
    link); its size, or None where nothing was removed."""
    if path.parent != log_dir or path.is_symlink():
        return None
    size = _own_log_size(path, log_dir)
    with contextlib.suppress(OSError):
        os.unlink(path)
        return size
    return None
