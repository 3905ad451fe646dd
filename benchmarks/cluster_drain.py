"""How fast a cluster drains a long queue onto a freed card, and what each pass writes.

Two nodes' schedulers on one SQLite file (tests/world.py `make_cluster`: the real store,
pass rules, election, placements and starts; the launcher and the GPUs are test doubles,
so no process is forked and the figure is the scheduler's own cost), one 24G GPU each,
--queued jobs of 1G waiting (issue 26: 10,000). Each round every running job ends (the
cards are freed), then both nodes pass: the elected one places, each agent starts what
was placed on it. Reported: jobs started per second of pass time, and the rows of
`jobs` each pass updated for waiting reasons (before issue 26: every waiting job's,
every pass).

    python benchmarks/cluster_drain.py [--queued 10000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Figure, print_conditions, report
from sqlalchemy import event

from gpusched.core.models import JobState
from gpusched.store import NewJob
from tests.fakes import GiB
from tests.world import World, make_cluster

TARGET_JOBS_PER_S = 20.0


def _queue(world: World, count: int) -> None:
    new = NewJob(
        user="alice",
        uid=1000,
        gid=1000,
        command=["train.py"],
        cwd="/",
        env={},
        umask=0o022,
        mem=GiB,
    )
    world.scheduler.store.jobs.add_many([new] * count, "2026-01-05T09:00:00+00:00", as_array=True)


def measure(queued: int, rounds: int) -> tuple[float, float, int]:
    """(jobs started per second of pass time, waiting-reason rows written per pass after
    the first, jobs started)."""
    with tempfile.TemporaryDirectory() as tmp:
        a, b = make_cluster(Path(tmp), ["a", "b"], [24 * GiB])
        a.tick()
        b.tick()
        _queue(a, queued)
        reason_rows = [0]

        def count(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if statement.startswith("UPDATE jobs SET waiting_reason"):
                reason_rows[0] += len(params) if isinstance(params, list) else 1

        for world in (a, b):
            event.listen(world.scheduler.store.database.engine, "after_cursor_execute", count)
        a.tick()  # the first pass says why every job waits
        b.tick()
        reason_rows[0] = 0
        passing = 0.0
        started = 0
        for _ in range(rounds):
            for world in (a, b):
                for job_id in list(world.launcher.running):
                    world.finish(job_id)
            before = len(a.launcher.started) + len(b.launcher.started)
            began = time.perf_counter()
            a.tick()
            b.tick()
            passing += time.perf_counter() - began
            started += len(a.launcher.started) + len(b.launcher.started) - before
        assert a.scheduler.store.jobs.get(a.launcher.started[-1]).state == JobState.RUNNING
        return started / passing, reason_rows[0] / rounds, started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print_conditions()
    rate, rows, started = measure(args.queued, args.rounds)
    report(
        "cluster drain",
        [
            Figure(
                f"jobs started per second, {args.queued:,} queued",
                rate,
                "jobs/s",
                f">= {TARGET_JOBS_PER_S:g}",
                rate >= TARGET_JOBS_PER_S,
            ),
            Figure("waiting reasons written per pass", rows, "rows"),
            Figure("jobs started in the run", started, "jobs"),
        ],
    )


if __name__ == "__main__":
    main()
