"""Retention: forgetting jobs that ended long ago, with what they left on disk.

One function, `prune_ended`, used by `gpusched admin prune` (an administrator, on demand,
with explicit arguments) and meant for the daemon's own periodic retention (the
`retention:` config key), which passes the same two values. Each call handles at most
`PRUNE_BATCH` jobs, so a request never holds the daemon's attention for long; the
caller calls again while `more` is true.

What goes, per job: its row (its timeline with it), its log when the log is in
`log_dir` (a log elsewhere was not written by gpusched: left alone), and its directory
under `state_dir/jobs/` (its spec and exit record). A job an active job waits for
(`--after`) is kept until that one is judged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpusched.core.clock import iso
from gpusched.store import Store

log = logging.getLogger("gpusched.retention")

PRUNE_BATCH = 2000  # jobs per call


@dataclass(frozen=True)
class PruneReport:
    jobs: int  # rows deleted (with dry_run: that would be)
    log_bytes: int  # the size of the logs removed (or that would be)
    more: bool  # another call finds more to prune
    cutoff: str  # jobs that ended before this time (ISO, UTC)

    def to_json(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "log_bytes": self.log_bytes,
            "more": self.more,
            "cutoff": self.cutoff,
        }


def prune_ended(
    store: Store,
    *,
    ended_before_s: float,
    log_dir: Path,
    jobs_dir: Path,
    dry_run: bool = False,
    now: datetime | None = None,
) -> PruneReport:
    """Forget up to PRUNE_BATCH jobs that ended more than `ended_before_s` seconds before
    `now` (module docstring)."""
    moment = now if now is not None else datetime.now(timezone.utc)
    cutoff = iso(moment - timedelta(seconds=ended_before_s))
    found = store.ended_before(cutoff, PRUNE_BATCH + 1)
    batch, more = found[:PRUNE_BATCH], len(found) > PRUNE_BATCH
    log_bytes = 0
    for job in batch:
        path = _own_log(job.log_path, log_dir)
        if path is not None:
            with contextlib.suppress(OSError):
                log_bytes += path.lstat().st_size
    if dry_run:
        return PruneReport(len(batch), log_bytes, more, cutoff)
    # The rows first: a file removed for a row that stays would be a job without its log.
    deleted = store.delete_ended([job.id for job in batch])
    for job in batch:
        path = _own_log(job.log_path, log_dir)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a link planted there goes, never what it points at
        shutil.rmtree(jobs_dir / str(job.id), ignore_errors=True)
    if deleted:
        log.info("retention: forgot %d job(s) that ended before %s", deleted, cutoff)
    return PruneReport(deleted, log_bytes, more, cutoff)


def _own_log(log_path: str | None, log_dir: Path) -> Path | None:
    """The job's log if gpusched wrote it in `log_dir` (ID.log there), else None."""
    if not log_path:
        return None
    path = Path(log_path)
    return path if path.parent == log_dir else None
