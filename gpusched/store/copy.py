"""Copy one installation's queue and history into another database (`gpusched admin
copy-database`), e.g. a one-server SQLite file into a lab's shared PostgreSQL.

Run as root with the daemon stopped (it must not write the source meanwhile). Both
databases are first brought to this gpusched's schema. Every job row, the environments
its jobs use, their time series, the earlier runs of requeued jobs (`job_attempts`) and
the blocked head's kept cards (`head_claims`, unless the target keeps its own) are copied
in one transaction on the target: all or nothing. What is not job history is not copied:
a cluster's `nodes` and `leases` rows are the source servers' liveness, which each daemon
writes again when it joins the target; nor is `queue_marks`, the target's own change
marker, which its triggers move as the copied queued rows go in.

Job ids. Into a database without jobs, ids are kept: running jobs' supervisors, state
directories and logs are found by id, so the daemon, started again on the target, re-adopts
them. Into a database that has jobs already, only when asked (`merge=True`), ids are
shifted past the target's highest, and everything that names a job by id moves with them
(`after` dependencies, OOM retries' `retry_of` and `retried_as`), as do array ids; a source
with running jobs is then refused, since their supervisors know them by their old ids.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Table, func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from gpusched.core.errors import ConflictError, GpuschedError, UsageError
from gpusched.core.models import TERMINAL_STATES, JobState
from gpusched.store import Store
from gpusched.store.engine import describe_url, is_disconnect, unavailable
from gpusched.store.migrations import lift_server_bounds
from gpusched.store.rows import lock_submits
from gpusched.store.schema import envs, head_claims, job_attempts, jobs, timeline_points
from gpusched.store.waits import unbounded

_BATCH = 500  # rows per INSERT


@dataclass(frozen=True)
class CopyReport:
    jobs: int
    active: int
    environments: int
    id_shift: int  # added to every source id (0: ids kept)
    timeline_points: int
    attempts: int = 0  # earlier runs of requeued jobs

    def describe(self, source: str, target: str) -> str:
        ids = "ids kept" if self.id_shift == 0 else f"ids shifted by +{self.id_shift}"
        return (
            f"copied {self.jobs} jobs ({self.active} not ended), {self.environments}"
            f" environments, {self.timeline_points} time-series points and"
            f" {self.attempts} earlier runs from {source} to {target}; {ids}"
        )


def _shift_ids(value: Any, shift: int) -> Any:
    return [int(i) + shift for i in value] if isinstance(value, list) else value


def _shifted(row: dict[str, Any], shift: int, array_shift: int, env_ids: dict[int, int]) -> None:
    """Move every job id (and array id) in `row` by the shifts, in place."""
    row["id"] += shift
    row["after"] = _shift_ids(row["after"], shift)
    for name in ("retry_of", "retried_as"):
        if row[name] is not None:
            row[name] += shift
    if row["array_id"] is not None:
        row["array_id"] += array_shift
    if row["env_id"] is not None:
        row["env_id"] = env_ids[row["env_id"]]


def _copy_envs(source: Connection, target: Connection) -> dict[int, int]:
    """Every source environment in the target (matched by digest): source id -> target id."""
    mapping: dict[int, int] = {}
    for env_id, digest, env in source.execute(select(envs.c.id, envs.c.digest, envs.c.env)):
        found = target.execute(select(envs.c.id).where(envs.c.digest == digest)).scalar()
        if found is None:
            found = target.execute(
                envs.insert().values(digest=digest, env=env).returning(envs.c.id)
            ).scalar_one()
        mapping[int(env_id)] = int(found)
    return mapping


def _copy_by_job(source: Connection, target: Connection, table: Table, shift: int) -> int:
    """Every row of a table keyed by job (time series, earlier runs), after the jobs
    (its rows name them), their job ids shifted; how many rows."""
    copied = 0
    batch: list[dict[str, Any]] = []
    for row in source.execute(select(table)).mappings():
        batch.append({**row, "job_id": row["job_id"] + shift})
        if len(batch) == _BATCH:
            target.execute(table.insert(), batch)
            copied, batch = copied + len(batch), []
    if batch:
        target.execute(table.insert(), batch)
        copied += len(batch)
    return copied


def _copy_head_claim(source: Connection, target: Connection, shift: int) -> None:
    """The cards kept for the source's blocked head, unless the target keeps some for its
    own head (one claim at most: scheduling.policy.head_claim)."""
    if target.execute(select(func.count()).select_from(head_claims)).scalar_one():
        return
    for row in source.execute(select(head_claims)).mappings():
        target.execute(head_claims.insert().values({**row, "job_id": row["job_id"] + shift}))


def _advance_sequences(target: Connection) -> None:
    """PostgreSQL hands out ids from a sequence that explicit ids do not move: move it past
    the copied ones (SQLite takes the highest id + 1 by itself)."""
    if target.dialect.name != "postgresql":
        return
    for table in ("jobs", "envs"):
        target.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"  # noqa: S608 - two fixed names
                f" GREATEST((SELECT max(id) FROM {table}), 1))"
            )
        )


def copy_database(source_url: str, target_url: str, *, merge: bool = False) -> CopyReport:
    """Copy every job of `source_url` into `target_url` (see the module docstring)."""
    if source_url.startswith("sqlite:///") and not Path(source_url[len("sqlite:///") :]).is_file():
        # Opening it would create an empty database and copy nothing, successfully.
        raise UsageError(f"no database at {source_url}")
    source = Store(source_url)
    try:
        target = Store(target_url)
    except BaseException:
        source.close()
        raise
    try:
        if source.where == target.where:
            raise UsageError("the source and the target are the same database")
        # One long transaction by design (all or nothing): no bound on its waits.
        with unbounded(), source.database.read() as src, target.database.engine.begin() as dst:
            if dst.dialect.name == "postgresql":
                lift_server_bounds(dst)
            lock_submits(dst)  # no submit lands between our reads and writes
            top = dst.execute(select(func.max(jobs.c.id))).scalar()
            if top is not None and not merge:
                raise ConflictError(
                    f"{target.where} already has jobs (up to id {top}): copy into an empty"
                    " database, or pass --merge to add these with shifted ids"
                )
            shift = int(top or 0)
            running = src.execute(
                select(func.count()).where(jobs.c.state == str(JobState.RUNNING))
            ).scalar_one()
            if shift and running:
                raise ConflictError(
                    f"{running} jobs of {source.where} are running: their supervisors know"
                    " them by id, which a merge would change; copy when they have ended"
                )
            array_shift = int(dst.execute(select(func.max(jobs.c.array_id))).scalar() or 0)
            env_ids = _copy_envs(src, dst)
            ended = {str(s) for s in TERMINAL_STATES}
            copied = active = 0
            batch: list[dict[str, Any]] = []
            for row in src.execute(select(jobs).order_by(jobs.c.id)).mappings():
                values = dict(row)
                _shifted(values, shift, array_shift, env_ids)
                active += values["state"] not in ended
                batch.append(values)
                if len(batch) == _BATCH:
                    dst.execute(jobs.insert(), batch)
                    copied += len(batch)
                    batch = []
            if batch:
                dst.execute(jobs.insert(), batch)
                copied += len(batch)
            points = _copy_by_job(src, dst, timeline_points, shift)
            attempts = _copy_by_job(src, dst, job_attempts, shift)
            _copy_head_claim(src, dst, shift)
            _advance_sequences(dst)
        return CopyReport(copied, active, len(env_ids), shift, points, attempts)
    finally:
        source.close()
        target.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpusched admin copy-database",
        description="Copy a gpusched queue and history into another database.",
    )
    parser.add_argument("--from", dest="source", required=True, metavar="URL")
    parser.add_argument("--to", dest="target", required=True, metavar="URL")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="the target has jobs already: add these after them, with shifted ids",
    )
    args = parser.parse_args(argv)
    try:
        report = copy_database(args.source, args.target, merge=args.merge)
    except DBAPIError as exc:
        if not is_disconnect(exc):
            raise
        where = f"{describe_url(args.source)} or {describe_url(args.target)}"
        failed: GpuschedError = unavailable(exc, where)
        print(f"gpusched: {failed.message}", file=sys.stderr)
        return failed.exit_code
    except GpuschedError as exc:
        print(f"gpusched: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(report.describe(describe_url(args.source), describe_url(args.target)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
