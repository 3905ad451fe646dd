"""How fast the rest of a cluster starts jobs while one node is cut off (issue 26's
liveness goal: at least 80 % of their rate without the fault).

Three real daemons (a, b, c; `2x24G` each, poll 0.5 s, node_timeout 4 s) on a private
PostgreSQL (fsync on, the server-side bounds of docs/cluster.md section 1, scaled to the
tests' node_timeout), each behind its own fault proxy (tests/faultproxy.py, the fault
suite's harness: tests/faultcluster.py). Jobs of --seconds each, --mem 10G (two per
card), restricted with `--node` to the two nodes that are not cut off, so that the same
eight slots serve them with and without the fault. Each job records its own start
(tests/faultchecks.py); starts are counted from those records.

For each fault: the victim is a plain node or the elected scheduler; the fault is a cut
inside a write transaction (right after its lease renewal's `UPDATE nodes`, or the
election's `UPDATE leases`: its row lock held until the server's
idle_in_transaction_session_timeout) or a plain partition (everything blackholed).

1. Without the fault: an array of --jobs jobs is submitted; the rate is the starts per
   second over --window seconds from one job length after the first start (the first
   eight start at once), while the queue is still long.
2. The fault, then the same array: `resumed` is the time from the fault to the first
   start; the rate is measured the same way from one job length after that first start.
   Also the rate over the whole window from the fault itself, stall included.

Reported per fault: seconds to resume, the rate with the fault, its ratio to the rate
without (target >= 0.8), and the checkers' verdict (no double start, no overcommit).

    python benchmarks/cluster_liveness.py [--jobs 80] [--seconds 2] [--window 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Figure, print_conditions, report

from tests.daemon_harness import RunningDaemon, eventually
from tests.faultcluster import Cluster
from tests.postgres import TEMPLATE, PostgresServer, private_server

TARGET_RATIO = 0.8
NODES = ("a", "b", "c")
FAULTS = {
    "plain node cut inside a transaction": ("agent", "UPDATE nodes"),
    "scheduler cut inside a transaction": ("scheduler", "UPDATE leases"),
    "plain node partitioned": ("agent", None),
}


def _factory(root: Path) -> Any:
    def make(name: str, **kwargs: Any) -> RunningDaemon:
        (root / name).mkdir(exist_ok=True)
        return RunningDaemon(root / name, **kwargs)

    return make


def _submit_array(cluster: Cluster, via: RunningDaemon, others: list[str], args: Any) -> None:
    values = ",".join(str(i) for i in range(args.jobs))
    command = [*cluster.history.job(args.seconds), "{i}"]  # the recorder ignores "{i}"
    done = via.cli(
        "submit", "--mem", "10G", "--node", ",".join(others), "--sweep", f"i={values}", "--",
        *command,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr)


def _starts(cluster: Cluster, since: float) -> list[float]:
    return sorted(run.start for run in cluster.history.runs() if run.start >= since)


def _rate(starts: list[float], begin: float, window: float) -> float:
    """Starts per second in [begin, begin + window); refused if the queue ran dry in it."""
    inside = [t for t in starts if begin <= t < begin + window]
    if not starts or starts[-1] < begin + window:
        raise RuntimeError(
            f"the queue ran dry before the window's end ({len(inside)} starts): raise --jobs"
        )
    return len(inside) / window


def _all_done(cluster: Cluster) -> bool:
    counts = cluster.store.jobs.count_active_by_user().values()
    return not any(states.get("queued") or states.get("running") for states in counts)


def _declare_all(cluster: Cluster) -> None:
    """Every job's declared memory, for the overcommit checker."""
    count = cluster.store.jobs.count()
    for job in cluster.store.jobs.iter_jobs(list(range(1, count + 1))):
        cluster.declared[job.id] = float(job.mem or 0)


def measure(server: PostgresServer, root: Path, fault: str, args: Any) -> dict[str, float]:
    role, statement = FAULTS[fault]
    root.mkdir(parents=True)
    database = server.create_database(template=TEMPLATE)
    cluster = Cluster(server, database, _factory(root), root)
    try:
        daemons = {name: cluster.node(name) for name in NODES}
        holder = eventually(cluster.scheduler, 30)
        victim = holder if role == "scheduler" else next(n for n in NODES if n != holder)
        others = [n for n in NODES if n != victim]
        via = daemons[others[0]]

        began = time.monotonic()
        _submit_array(cluster, via, others, args)
        eventually(lambda: _starts(cluster, began), 60, interval=0.1)
        first = _starts(cluster, began)[0]
        eventually(lambda: time.monotonic() > first + args.seconds + args.window + 1, 120)
        normal = _rate(_starts(cluster, began), first + args.seconds, args.window)
        eventually(lambda: _all_done(cluster), 300, interval=0.5)

        proxy = cluster.proxies[victim]
        if statement is None:
            proxy.blackhole()
        elif not proxy.cut_inside_transaction(statement).wait(30):
            raise RuntimeError(f"{victim} never sent {statement}")
        cut_at = time.monotonic()
        _submit_array(cluster, via, others, args)
        eventually(lambda: _starts(cluster, cut_at), 120, interval=0.1)
        resumed_at = _starts(cluster, cut_at)[0]
        horizon = max(resumed_at + args.seconds, cut_at) + args.window + 1
        eventually(lambda: time.monotonic() > horizon, 180)
        starts = _starts(cluster, cut_at)
        faulted = _rate(starts, resumed_at + args.seconds, args.window)
        from_cut = _rate(starts, cut_at, args.window)
        victim_starts = cluster.history.starts_between(cut_at, time.monotonic()).get(victim, 0)
        proxy.heal()
        eventually(lambda: _all_done(cluster), 300, interval=0.5)
        _declare_all(cluster)
        cluster.check()
        if victim_starts:
            raise RuntimeError(f"{victim} started {victim_starts} jobs while cut off")
        return {
            "normal": normal,
            "faulted": faulted,
            "from_cut": from_cut,
            "resumed_s": resumed_at - cut_at,
        }
    finally:
        cluster.tear_down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=80, help="jobs per array")
    parser.add_argument("--seconds", type=float, default=2.0, help="each job's length")
    parser.add_argument("--window", type=float, default=10.0, help="seconds a rate is taken over")
    parser.add_argument("--fault", choices=sorted(FAULTS), action="append")
    args = parser.parse_args()
    print_conditions()
    figures = []
    with private_server(fsync=True) as server, tempfile.TemporaryDirectory() as tmp:
        for fault in args.fault or list(FAULTS):
            got = measure(server, Path(tmp) / fault.replace(" ", "-"), fault, args)
            ratio = got["faulted"] / got["normal"]
            print(
                f"{fault}: {got['normal']:.2f} starts/s without, {got['faulted']:.2f} with"
                f" ({ratio:.2f}), resumed after {got['resumed_s']:.1f} s,"
                f" {got['from_cut']:.2f}/s over the window from the fault",
                flush=True,
            )
            figures += [
                Figure(f"{fault}: resumed after (s)", got["resumed_s"], "s"),
                Figure(f"{fault}: starts/s without the fault", got["normal"], "/s"),
                Figure(f"{fault}: starts/s once resumed", got["faulted"], "/s"),
                Figure(
                    f"{fault}: with / without",
                    ratio,
                    "x",
                    f">= {TARGET_RATIO:g}",
                    ratio >= TARGET_RATIO,
                ),
                Figure(f"{fault}: starts/s from the fault, stall included", got["from_cut"], "/s"),
            ]
    report("cluster liveness", figures, {"argv": sys.argv[1:]})


if __name__ == "__main__":
    main()
