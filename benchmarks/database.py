"""SQLite beside PostgreSQL in one run: `status` latency, submit throughput, claims per second.

PostgreSQL is a private server started for the run (tests/postgres.py: Debian's binaries,
Unix socket only), with fsync on and synchronous_commit on: a commit is on disk when it
returns, as with SQLite's synchronous=FULL. Each figure is measured on both backends in
the same run, one after the other, and reported as PostgreSQL / SQLite.

1. `status` latency. A real daemon (`simulate: 1x24G`, its GPU held by a blocker job) over a
   database holding --ended ended jobs (written before the daemon starts, as
   cli_latency.py writes them). Median of --runs calls of `Client.status_reply()` (the
   socket and the daemon, no process start-up), and of `gpusched status` as a fresh
   process (what a user waits for).
2. Submit throughput. Then --clients client processes send --submits submits each through
   `Client.submit`, starting together (throughput.py's clients); all stay queued. Every
   acknowledged submit must be in the database afterwards.
3. Claims per second. In this process's children, on a fresh database: --claim-jobs queued
   jobs, and 3 processes, each with its own Store (its own connections), racing to claim
   them with `store.jobs.mark_running` (the conditional UPDATE ... WHERE state='queued' a start
   is), each going through the queue in its own order. Every job must be claimed exactly
   once. (Three daemons on one PostgreSQL are what issue 15's cluster will run; the
   database's part of a claim is this.)

    python benchmarks/database.py [--runs 20] [--ended 10000] [--clients 8] [--submits 100]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from _common import Figure, median_time, print_conditions, report
from cli_latency import fill_history
from throughput import Work, run_clients

from gpusched.store import NewJob, Store
from tests.daemon_harness import RunningDaemon
from tests.postgres import PostgresServer, private_server

CLAIMERS = 3
BASELINE = " (baseline)"  # the figures of --baseline-tree's daemon end with this
STATUS_GOAL = 1.5  # issue 30: `status` on PostgreSQL at most 1.5x the same on SQLite
STATUS_GOAL_KEYS = ("status_api_s", "status_api_queued_s")
NOW = "2026-11-25T00:00:00+00:00"


def _rounds(calls: Mapping[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median wall time of each call, measured in rounds (one of each per round, after two
    untimed rounds), so that a change in the machine's load falls on all of them."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for round_number in range(runs + 2):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_number >= 2:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def _start_daemon(
    url: str, args: argparse.Namespace, root: Path, tree: str | None
) -> RunningDaemon:
    """A daemon over --ended ended jobs, its one GPU held by a blocker (submits queue);
    `tree`: run the gpusched package of that tree (--baseline-tree) instead of this one."""
    root.mkdir()
    fill_history(url, args.ended, str(root))
    env = None if tree is None else {"PYTHONPATH": tree}
    daemon = RunningDaemon(root, simulate="1x24G", config={"database": url}, env=env)
    daemon.config_path.chmod(0o600)
    daemon.start()
    blocker = daemon.client().submit(["sleep", "3600"], cwd=root)
    daemon.wait_state(blocker.id, {"running"})
    return daemon


def _status_and_submits(
    new_url: Callable[[str], str], name: str, args: argparse.Namespace, root: Path
) -> dict[str, float]:
    """`status` and submits on this tree's daemon and, with --baseline-tree, `status` on
    the baseline tree's daemon too (its own database, the same jobs), in the same rounds."""
    trees: dict[str, str | None] = {"": None}
    if args.baseline_tree is not None:
        trees[BASELINE] = str(args.baseline_tree.resolve())
    urls = {suffix: new_url(f"daemon-{name}{suffix.strip(' ()')}") for suffix in trees}
    daemons: dict[str, RunningDaemon] = {}
    figures: dict[str, float] = {}
    acked: list[Any] = []
    try:
        for suffix, tree in trees.items():
            home = root / f"daemon{suffix.strip(' ()')}"
            daemons[suffix] = _start_daemon(urls[suffix], args, home, tree)
        clients = {suffix: daemon.client() for suffix, daemon in daemons.items()}
        daemon = daemons[""]
        asks = {f"status_api_s{s}": c.status_reply for s, c in clients.items()}
        figures.update(_rounds(asks, args.runs))
        cli = [str(Path(sys.executable).with_name("gpusched")), "status"]
        env = {**daemon.env, "GPUSCHED_SOCKET": str(daemon.socket_path)}
        env.pop("GPUSCHED_CONFIG", None)
        figures["status_cli_s"], _ = median_time(
            lambda: subprocess.run(cli, env=env, check=True, stdout=subprocess.DEVNULL),
            args.runs,
        )
        for suffix, each in daemons.items():
            deadline = time.monotonic() + 300
            work = Work(str(each.socket_path), "submit", args.submits, str(root), deadline)
            wall, acked_here, errors_here = run_clients(work, args.clients)
            if suffix == "":  # the baseline's submits only give its queue the same length
                figures["submits_per_s"] = len(acked_here) / wall
                figures["submits_failed"] = len(errors_here)
                acked = acked_here
        asks = {f"status_api_queued_s{s}": c.status_reply for s, c in clients.items()}
        figures.update(_rounds(asks, args.runs))
    finally:
        for each in daemons.values():
            each.stop()
            each.kill_jobs()
    store = Store(urls[""])
    try:
        figures["submits_recorded"] = store.jobs.count() - args.ended - 1  # less the blocker
        figures["submits_acknowledged"] = len(acked)
    finally:
        store.close()
    return figures


def _status_side_by_side(
    backends: dict[str, Callable[[str], str]], args: argparse.Namespace, root: Path
) -> dict[str, float]:
    """--side-by-side: a daemon per backend (and per tree with --baseline-tree) running at
    once, `status` asked of each in the same rounds, so that PostgreSQL / SQLite is not
    moved by the machine's load changing between the two backends' parts of the run."""
    trees: dict[str, str | None] = {"": None}
    if args.baseline_tree is not None:
        trees[BASELINE] = str(args.baseline_tree.resolve())
    daemons: dict[str, RunningDaemon] = {}
    try:
        for name, new_url in backends.items():
            for suffix, tree in trees.items():
                home = root / f"side-{name}{suffix.strip(' ()')}"
                url = new_url(f"side-{name}{suffix.strip(' ()')}")
                daemons[f"{name}{suffix}"] = _start_daemon(url, args, home, tree)
        asks = {key: daemon.client().status_reply for key, daemon in daemons.items()}
        return _rounds(asks, args.side_by_side)
    finally:
        for each in daemons.values():
            each.stop()
            each.kill_jobs()


def _claimer(url: str, ids: list[int], seed: int, barrier: Any, out: Any) -> None:
    store = Store(url)
    order = list(ids)
    random.Random(seed).shuffle(order)
    won: list[int] = []
    barrier.wait()
    for job_id in order:
        if store.jobs.mark_running(
            job_id,
            gpu_indices=[0],
            gpu_uuids=["GPU-0"],
            pid=None,
            pid_start_time=None,
            log_path=f"/dev/null/{job_id}",
            now=NOW,
        ):
            won.append(job_id)
    store.close()
    out.put(won)


def _claims(url: str, n_jobs: int) -> dict[str, float]:
    store = Store(url)
    new = NewJob(user="bench", uid=1, gid=1, command=["true"], cwd="/", env={}, umask=18, mem=1)
    ids = [job.id for job in store.jobs.add_many([new] * n_jobs, NOW)]
    store.close()
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(CLAIMERS + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_claimer, args=(url, ids, seed, barrier, out))
        for seed in range(CLAIMERS)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    start = time.perf_counter()
    wins = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - start
    for proc in procs:
        proc.join(timeout=60)
    claimed = [job_id for won in wins for job_id in won]
    store = Store(url)
    running = len(store.jobs.running())
    store.close()
    return {
        "claims_per_s": len(claimed) / wall,
        "claimed_twice": len(claimed) - len(set(claimed)),
        "claimed": len(set(claimed)),
        "running": running,
        "attempts_per_s": len(ids) * CLAIMERS / wall,
    }


def _backends(server: PostgresServer, tmp: Path) -> dict[str, Callable[[str], str]]:
    """name -> a new empty database's URL for a purpose (a name used in its path)."""

    def sqlite(purpose: str) -> str:
        return f"sqlite:///{tmp / purpose / 'gpusched.db'}"

    def postgres(_purpose: str) -> str:
        return server.url(server.create_database())

    return {"sqlite": sqlite, "postgresql": postgres}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ended", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--submits", type=int, default=100)
    parser.add_argument("--claim-jobs", type=int, default=1000)
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also start every daemon at once (both backends, and the baseline's) and time"
        " `status` (Client API) in the same ROUNDS rounds",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also time `status` (Client API) on a daemon running that tree's gpusched (a"
        " checkout of an earlier commit, e.g. from `git archive`), in the same rounds",
    )
    args = parser.parse_args()
    print_conditions()
    results: dict[str, dict[str, float]] = {}
    with private_server(fsync=True) as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # `python -m gpusched` puts the working directory before PYTHONPATH: run from a
        # checkout, --baseline-tree's daemon would run that checkout's gpusched.
        os.chdir(tmp)
        for name, new_url in _backends(server, tmp).items():
            root = tmp / f"daemon-{name}"
            root.mkdir()
            results[name] = _status_and_submits(new_url, name, args, root)
            results[name].update(_claims(new_url(f"claims-{name}"), args.claim_jobs))
        side = {}
        if args.side_by_side:
            side = _status_side_by_side(_backends(server, tmp), args, tmp)
    sq, pg = results["sqlite"], results["postgresql"]
    rows = [  # label, key, scale, unit
        ("status, Client API (ms)", "status_api_s", 1e3, "ms"),
        (
            f"status, Client API, {args.clients * args.submits} more queued (ms)",
            "status_api_queued_s",
            1e3,
            "ms",
        ),
        ("gpusched status, fresh process (ms)", "status_cli_s", 1e3, "ms"),
        (f"submits per second ({args.clients} clients)", "submits_per_s", 1, "/s"),
        (f"claims per second ({CLAIMERS} processes racing)", "claims_per_s", 1, "/s"),
    ]
    if args.baseline_tree is not None:
        rows[2:2] = [
            (label + BASELINE, key + BASELINE, scale, unit) for label, key, scale, unit in rows[:2]
        ]
    print(f"{'':58} {'SQLite':>10} {'PostgreSQL':>11} {'PG/SQLite':>10}")
    figures = []
    for label, key, scale, unit in rows:
        ratio = pg[key] / sq[key]
        print(f"  {label:<56} {sq[key] * scale:10.1f} {pg[key] * scale:11.1f} {ratio:9.2f}x")
        goal = key in STATUS_GOAL_KEYS  # issue 30: this tree's status, at most 1.5x
        figures += [
            Figure(f"{label}, SQLite", sq[key] * scale, unit),
            Figure(f"{label}, PostgreSQL", pg[key] * scale, unit),
            Figure(
                f"{label}, PostgreSQL / SQLite",
                ratio,
                "x",
                f"<= {STATUS_GOAL}x" if goal else None,
                ratio <= STATUS_GOAL if goal else None,
            ),
        ]
    for suffix in ("", BASELINE) if args.baseline_tree is not None else ("",):
        if side:
            label = f"status, Client API, side by side{suffix} (ms)"
            ratio = side[f"postgresql{suffix}"] / side[f"sqlite{suffix}"]
            sq_ms, pg_ms = side[f"sqlite{suffix}"] * 1e3, side[f"postgresql{suffix}"] * 1e3
            print(f"  {label:<56} {sq_ms:10.1f} {pg_ms:11.1f} {ratio:9.2f}x")
            goal = suffix == ""
            figures += [
                Figure(f"{label}, SQLite", sq_ms, "ms"),
                Figure(f"{label}, PostgreSQL", pg_ms, "ms"),
                Figure(
                    f"{label}, PostgreSQL / SQLite",
                    ratio,
                    "x",
                    f"<= {STATUS_GOAL}x" if goal else None,
                    ratio <= STATUS_GOAL if goal else None,
                ),
            ]
    for name, got in results.items():
        exact = got["claimed_twice"] == 0 and got["claimed"] == got["running"] == args.claim_jobs
        recorded = got["submits_recorded"] == got["submits_acknowledged"]
        figures += [
            Figure(
                f"{name}: jobs claimed exactly once",
                got["claimed"],
                "jobs",
                f"= {args.claim_jobs}, none twice",
                exact,
            ),
            Figure(
                f"{name}: acknowledged submits recorded",
                got["submits_recorded"],
                "jobs",
                f"= {got['submits_acknowledged']:.0f}",
                recorded,
            ),
            Figure(
                f"{name}: submits failed",
                got["submits_failed"],
                "",
                "0",
                got["submits_failed"] == 0,
            ),
        ]
    report("database", figures)


if __name__ == "__main__":
    main()
