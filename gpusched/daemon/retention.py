"""The daemon's retention pass: run every `retention.every`, it deletes what ended jobs
leave once it is old enough (gpusched.store.retention for the database), unlinks the
logs that expired, and removes each ended job's directory under `state_dir/jobs`.

A job's directory (its supervisor's identity and exit record; the spec, with the job's
environment, is deleted by the supervisor as soon as it has read it) goes once the
job's end is recorded from that exit record and made durable (`checkpoint`), and only
for jobs ended at least DIR_GRACE_S ago. A job ended `lost` or `node_lost` keeps its
directory: a supervisor still running elsewhere, or a restarted daemon, may yet need the
exit record to settle it (docs/operations.md, "Retention").
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import datetime
from pathlib import Path

from gpusched.core.config_holder import ConfigHolder
from gpusched.core.models import TERMINAL_STATES, EndReason
from gpusched.processes.launcher import Launcher
from gpusched.store import Store
from gpusched.store.retention import Pruned, checkpoint, prune

log = logging.getLogger("gpusched.retention")

DIR_GRACE_S = 5.0  # PostgreSQL's WAL writer flushes asynchronous commits within 0.6 s
_KEEP_DIR_REASONS = frozenset({str(EndReason.LOST), str(EndReason.NODE_LOST)})


class RetentionPass:
    def __init__(self, settings: ConfigHolder, store: Store, launcher: Launcher) -> None:
        self._settings = settings
        self.store = store
        self.launcher = launcher

    def retention_pass(self) -> None:
        """One pass, from the daemon's background scheduler (a failure is logged there)."""
        self.run()

    def run(self, now: float | None = None) -> Pruned:
        """One pass as of `now` (epoch seconds); returns what the database lost."""
        now = time.time() if now is None else now
        config = self._settings.current
        done = prune(self.store, config.retention, now)
        removed_logs = sum(_unlink_log(Path(path), config.log_dir) for path in done.logs)
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
        return done

    def remove_job_dirs(self, now: float) -> int:
        """Remove the directories of jobs whose end is recorded from their exit record."""
        ids = self.launcher.job_ids()
        if not ids:
            return 0
        checkpoint(self.store)
        found = self.store.get_many(ids)
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


def _unlink_log(path: Path, log_dir: Path) -> bool:
    """Unlink a job's log, only if it is one of ours (a file directly in `log_dir`)."""
    if path.parent != log_dir or path.is_symlink():
        return False
    with contextlib.suppress(OSError):
        os.unlink(path)
        return True
    return False
