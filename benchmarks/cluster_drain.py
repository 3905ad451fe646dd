"""How fast a cluster drains a long queue onto a freed card, and what each pass writes.

Two nodes' schedulers on one database (tests/world.py `make_cluster`: the real store,
pass rules, election, placements and starts; the launcher and the GPUs are test doubles,
so no process is forked and the figure is the scheduler's own cost), one 24G GPU each,
--queued jobs of 1G waiting (issue 26: 10,000). Each round every running job ends (the
cards are freed), then both nodes pass: the elected one places, each agent starts what
was placed on it. Reported: jobs started per second of pass time, and the rows of
`jobs` each pass updated for waiting reasons (before issue 26: every waiting job's,
every pass).

The database: an SQLite file, or a private PostgreSQL (tests/postgres.py: initdb and
pg_ctl as `postgres`, fsync on, the server-side bounds of docs/cluster.md section 1)
over TCP, optionally through a proxy that delays each message by half of --rtt-ms each
way (tests/faultproxy.py), a lab network's round trip.

`--pack memory` (the default here) measures the scheduler's own cost: every 1G job that
fits starts. Under `pack: contention` (the daemon's default, issue 25) jobs of unknown
demand start a few a pass by design, so the rate is the policy's, not the scheduler's.

    python benchmarks/cluster_drain.py [--queued 10000] [--rounds 10]
        [--database sqlite|postgresql] [--rtt-ms 0] [--pack memory|contention]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import Figure, print_conditions, report
from sqlalchemy import event

from gpusched.core.models import JobState
from gpusched.store import NewJob
from tests.fakes import GiB
from tests.faultproxy import FaultProxy
from tests.postgres import SERVER_BOUNDS, TEMPLATE, private_server
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


@contextlib.contextmanager
def shared_database(kind: str, rtt_ms: float) -> Iterator[dict[str, Any]]:
    """The config naming the nodes' shared database ({}: make_cluster's SQLite file)."""
    if kind == "sqlite":
        yield {}
        return
    with private_server(fsync=True) as server:
        # docs/cluster.md section 1's idle-in-transaction bound for the nodes' default
        # node_timeout of 30 s (the tests' 2 s is for their 4 s).
        bounds = {**SERVER_BOUNDS, "idle_in_transaction_session_timeout": "10s"}
        database = server.create_database(template=TEMPLATE, bounds=bounds)
        os.environ["PGPASSWORD"] = server.password  # TCP, as a lab's nodes connect
        proxy = None
        if rtt_ms > 0:
            proxy = FaultProxy(server.port)
            proxy.delay(rtt_ms / 2000)
        try:
            yield {"database": server.tcp_url(database, None if proxy is None else proxy.port)}
        finally:
            if proxy is not None:
                proxy.close()


def measure(
    queued: int, rounds: int, database: dict[str, Any] | None = None, pack: str = "memory"
) -> tuple[float, float, int]:
    """(jobs started per second of pass time, waiting-reason rows written per pass after
    the first, jobs started)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = {**(database or {}), "pack": pack}
        a, b = make_cluster(Path(tmp), ["a", "b"], [24 * GiB], **config)
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
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="PostgreSQL: a network's")
    parser.add_argument("--pack", choices=["memory", "contention"], default="memory")
    args = parser.parse_args()
    print_conditions()
    with shared_database(args.database, args.rtt_ms) as database:
        rate, rows, started = measure(args.queued, args.rounds, database, args.pack)
    where = args.database if args.database == "sqlite" else f"PostgreSQL, rtt {args.rtt_ms:g} ms"
    where += f", pack: {args.pack}"
    report(
        f"cluster drain ({where})",
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
