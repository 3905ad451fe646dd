"""Storage of the per-job time series: bytes per job-hour in the SQLite database.

Jobs of four lengths (10 minutes, 1 hour, 8 hours, 72 hours) are run on a simulated
clock: each is submitted, marked running and, at every 2 s poll (the default
`poll_interval`), given a sample (memory climbing for ten minutes then holding with
noise, utilization swinging) through the daemon's own `TimelineBuffer`; its points are
written through the `Store` exactly as the usage monitor writes them (`set_usage` with the
new points once a minute, the rest with `mark_ended`). The database file (after a WAL
checkpoint) is measured before and after.

Baselines in the same run, on fresh databases with the same jobs and the same writes:
- the same jobs with no timeline at all (what the series adds on top of the job rows);
- every poll stored as its own row (no downsampling): what bounding the series saves.

The databases live on /dev/shm where there is one: the sizes are the same as on disk,
and the thousands of fsyncs (one per flush) do not make the run slow.

    python benchmarks/timeline_storage.py [--scale 1]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _common import Figure, GiB, print_conditions, report

from gpusched.core.models import JobState
from gpusched.store import NewJob, Store, TimelineRow, TimelineWrite
from gpusched.usage.timeline import MAX_POINTS, TimelineBuffer

POLL_S = 2.0
FLUSH_S = 60.0
START_S = 1_767_225_600.0  # 2026-01-01 00:00 UTC
NOW = "2026-01-01T00:00:00.000+00:00"
# (label, minutes each, how many): 2 + 4 + 8 + 72 job-hours at --scale 1.
SCENARIOS = [("10 min", 10, 12), ("1 h", 60, 4), ("8 h", 480, 1), ("72 h", 4320, 1)]


@dataclass
class Outcome:
    bytes: int
    points: int  # stored points, all jobs
    most_points: int  # of one job


class Writer:
    """One of the three ways of storing the samples, over its own database."""

    def __init__(self, path: Path, kind: str) -> None:
        self.kind = kind  # "timeline", "none" (baseline) or "raw" (every poll)
        self.path = path
        self.store = Store(f"sqlite:///{path}")

    def run_job(self, minutes: int, rng: random.Random) -> int:
        """One job from submit to end; returns how many points it stored."""
        job = self.store.jobs.add(
            NewJob(user="alice", uid=1000, gid=1000, command=["python", "train.py"],
                   cwd="/home/alice", env={"PATH": "/usr/bin"}, umask=0o022, mem=20 * GiB),
            NOW,
        )  # fmt: skip
        self.store.jobs.mark_running(
            job.id, gpu_indices=[0], gpu_uuids=["GPU-0"], pid=1, pid_start_time="1",
            log_path="/var/log/gpusched/jobs/1.log", now=NOW,
        )  # fmt: skip
        buffer = TimelineBuffer(START_S)
        raw: list[TimelineRow] = []
        polls = int(minutes * 60 / POLL_S)
        for i in range(polls + 1):
            age = i * POLL_S
            memory = int(min(1.0, age / 600) * 12 * GiB) + rng.randrange(0, 256 * 2**20)
            util = max(0.0, min(100.0, rng.gauss(85 if (age // 20) % 3 else 15, 8)))
            buffer.add(START_S + age, memory, util)
            raw.append(TimelineRow(START_S + age, memory, round(util, 1)))
            if age and age % FLUSH_S == 0:
                self.flush(job.id, buffer, raw, final=False)
        return self.flush(job.id, buffer, raw, final=True)

    def flush(
        self, job_id: int, buffer: TimelineBuffer, raw: list[TimelineRow], final: bool
    ) -> int:
        write = None
        if self.kind == "timeline":
            write = buffer.pending(final=final)
        elif self.kind == "raw" and raw:
            write = TimelineWrite(tuple(raw))
            raw.clear()
        state = {"util_samples": 1, "timeline": buffer.to_state()}  # as the monitor's flush
        if final:
            self.store.jobs.mark_ended(
                job_id, state=JobState.DONE, reason="exit", now=NOW, exit_code=0,
                usage={"peak_mem": 12 * GiB, "mean_util": 60, "usage_state": state},
                timeline=write,
            )  # fmt: skip
            return len(self.store.timeline.timeline_rows(job_id))
        self.store.usage.set_usage(job_id, timeline=write, usage_state=state)
        if write is not None and self.kind == "timeline":
            buffer.committed(write)
        return 0

    def size(self) -> int:
        raw = (
            self.store.database.engine.raw_connection()
        )  # no transaction open: a checkpoint may run
        try:
            raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            raw.close()
        return sum(
            p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file()
        )

    def close(self) -> None:
        self.store.close()


def measure(root: Path, kind: str, minutes: int, count: int, seed: int) -> Outcome:
    writer = Writer(root / kind / f"{minutes}.db", kind)
    try:
        empty = writer.size()
        rng = random.Random(seed)
        points = [writer.run_job(minutes, rng) for _ in range(count)]
        return Outcome(writer.size() - empty, sum(points), max(points))
    finally:
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="run this many times the jobs")
    args = parser.parse_args()
    print_conditions()
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    figures: list[Figure] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-", dir=where) as tmp:
        root = Path(tmp)
        for kind in ("timeline", "none", "raw"):
            (root / kind).mkdir()
        for seed, (label, minutes, each) in enumerate(SCENARIOS):
            count = each * args.scale
            hours = minutes / 60 * count
            series, base, raw = (
                measure(root, kind, minutes, count, seed) for kind in ("timeline", "none", "raw")
            )
            added = series.bytes - base.bytes
            per_hour = added / hours
            raw_per_hour = (raw.bytes - base.bytes) / hours
            rows.append((label, count, series.most_points, per_hour, raw_per_hour))
            print(
                f"{label:>6} jobs x{count}: {series.points / count:.0f} points a job"
                f" (every poll: {raw.points / count:.0f}); the database grew {added / 1024:.0f} KiB"
                f" more than with the same jobs and no timeline ({added / series.points:.0f} B"
                f" a point, pages' slack included): {per_hour / 1024:.2f} KiB per job-hour;"
                f" every poll stored: {raw_per_hour / 1024:.1f} KiB per job-hour",
                flush=True,
            )
            figures.append(
                Figure(f"timeline KiB per job-hour, {label} jobs", per_hour / 1024, "KiB")
            )
            figures.append(
                Figure(
                    f"every poll stored / timeline, {label} jobs",
                    raw_per_hour / max(per_hour, 1),
                    "x",
                )
            )
            if label == "72 h":
                figures.append(
                    Figure(
                        "points kept of a 72-hour job",
                        series.most_points,
                        "points",
                        target=f"<= {MAX_POINTS}",
                        ok=series.most_points <= MAX_POINTS,
                    )
                )
    report("timeline_storage", figures, {"rows": rows})


if __name__ == "__main__":
    main()
