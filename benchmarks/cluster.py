"""Three daemons sharing one queue beside one daemon with as many GPUs, in one run.

Real daemons on this machine, each with simulated GPUs: a cluster of 3 nodes (`2x24G`
each, poll 0.5 s, node_timeout 4 s) on one database, and as the baseline a single daemon
with `6x24G` and the same poll on its own database of the same kind. Both run --jobs
short jobs (one submit of a --sweep array, --mem 4G each: 5 per card, 30 at once) from
the submit until the queue is empty. Reported: jobs per second for each, the cluster's
over the baseline's (the price of the placements, starts and ends going through the
database between daemons), on SQLite (one file) and on PostgreSQL (a private server,
fsync on). Then `status` latency (Client API, median of --runs) asked of a daemon that
is not the scheduler, beside the single daemon's.

    python benchmarks/cluster.py [--jobs 300] [--runs 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import Figure, median_time, print_conditions, report

from gpusched.store import Store
from tests.daemon_harness import RunningDaemon, eventually
from tests.postgres import PostgresServer, private_server

NODES = ("a", "b", "c")


def _run_jobs(daemons: list[RunningDaemon], url: str, count: int) -> float:
    values = ",".join(str(i) for i in range(count))
    began = time.monotonic()
    done = daemons[0].cli("submit", "--mem", "4G", "--sweep", f"i={values}", "--", "true", "{i}")
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    store = Store(url)
    try:
        eventually(
            lambda: not store.jobs.count_active_by_user(),  # no user has an active job
            600,
            interval=0.05,
        )
        took = time.monotonic() - began
        states = {j.state for j in store.jobs.iter_jobs(list(range(1, count + 1)))}
    finally:
        store.close()
    if states != {"done"}:
        raise RuntimeError(f"jobs ended {states}")
    return took


def _measure(url: str, root: Path, args: argparse.Namespace, cluster: bool) -> dict[str, float]:
    settings: dict[str, Any] = {"database": url, "poll_interval": "0.5s"}
    if cluster:
        specs = [
            (name, "2x24G", {**settings, "node": name, "node_timeout": "4s"}) for name in NODES
        ]
    else:
        specs = [("one", "6x24G", settings)]
    daemons = []
    try:
        for name, simulate, config in specs:
            (root / name).mkdir(parents=True)
            daemon = RunningDaemon(root / name, simulate=simulate, config=config)
            daemon.config_path.chmod(0o600)
            daemons.append(daemon.start())
        took = _run_jobs(daemons, url, args.jobs)
        asked = daemons[-1].client()  # in a cluster the last started: not the scheduler
        status_s, _ = median_time(asked.status_reply, args.runs)
    finally:
        for daemon in daemons:
            daemon.stop()
            daemon.kill_jobs()
    return {"jobs_per_s": args.jobs / took, "status_s": status_s}


def _backends(server: PostgresServer, tmp: Path) -> dict[str, Callable[[str], str]]:
    def sqlite(purpose: str) -> str:
        return f"sqlite:///{tmp / purpose / 'gpusched.db'}"

    def postgres(_purpose: str) -> str:
        return server.url(server.create_database())

    return {"sqlite": sqlite, "postgresql": postgres}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print_conditions()
    figures = []
    with private_server(fsync=True) as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for backend, new_url in _backends(server, tmp).items():
            one = _measure(new_url(f"one-{backend}"), tmp / f"one-{backend}", args, False)
            three = _measure(new_url(f"three-{backend}"), tmp / f"three-{backend}", args, True)
            ratio = three["jobs_per_s"] / one["jobs_per_s"]
            print(
                f"{backend}: {one['jobs_per_s']:.1f} jobs/s on one daemon, "
                f"{three['jobs_per_s']:.1f} on three ({ratio:.2f}x); status "
                f"{one['status_s'] * 1e3:.1f} ms / {three['status_s'] * 1e3:.1f} ms",
                flush=True,
            )
            figures += [
                Figure(f"{backend}: jobs per second, one daemon 6x24G", one["jobs_per_s"], "/s"),
                Figure(f"{backend}: jobs per second, 3 daemons 2x24G", three["jobs_per_s"], "/s"),
                Figure(f"{backend}: 3 daemons / one daemon", ratio, "x"),
                Figure(f"{backend}: status, one daemon (ms)", one["status_s"] * 1e3, "ms"),
                Figure(
                    f"{backend}: status, a cluster daemon not scheduling (ms)",
                    three["status_s"] * 1e3,
                    "ms",
                ),
            ]
    report("cluster", figures, {"argv": sys.argv[1:]})


if __name__ == "__main__":
    main()
