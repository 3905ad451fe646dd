"""Submit throughput: 16 concurrent clients x 250 submits each, every one recorded.

A real daemon (`simulate: 1x24G`) whose only GPU is taken by a whole-GPU blocker job,
so the 4,000 submitted jobs (`--mem 1G`, `true`) all stay queued, as a sweep does on a
busy server: each submit is acknowledged once its row is committed, and wakes a
scheduling pass over the growing queue. 16 client processes (not threads: 16 users)
each send 250 submits through the Python API `gpusched.client.Client`, starting
together. Baseline in the same run: the same 16 x 250 requests as `ping` (the socket,
the server's thread per connection and the peer-credential check, no database).

Every acknowledged submit must be in the database (`store.jobs.count()` once the daemon has
stopped) and every submit should be acknowledged; failed submits are counted with
their messages. The clients stop after --budget seconds (default 120), so that the
whole benchmark run stays short even when submits are slow; submits not sent by then
are reported.

    python benchmarks/throughput.py [--clients 16] [--submits 250]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Figure, print_conditions, profiled, report

from gpusched.client import Client
from gpusched.core.errors import GpuschedError
from gpusched.store import Store
from tests.daemon_harness import RunningDaemon


@dataclass(frozen=True)
class Work:
    socket_path: str
    op: str  # submit | ping
    count: int
    cwd: str
    deadline: float  # time.monotonic() after which a client stops (same clock in every process)


def _client_worker(work: Work, barrier: Any, out: Any) -> None:
    client = Client(work.socket_path)
    done: list[float] = []  # monotonic time each acknowledged request returned
    errors: list[str] = []
    barrier.wait()
    for _ in range(work.count):
        if time.monotonic() > work.deadline:
            break
        try:
            if work.op == "submit":
                client.submit(["true"], mem="1G", cwd=work.cwd)
            else:
                client.ping()
            done.append(time.monotonic())
        except GpuschedError as exc:
            errors.append(exc.message)
    out.put((done, errors))


def run_clients(work: Work, clients: int) -> tuple[float, list[float], list[str]]:
    """(wall time from the common start to the last answer, answer times, errors)."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_client_worker, args=(work, barrier, out)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    barrier.wait()
    start = time.monotonic()
    done: list[float] = []
    errors: list[str] = []
    for _ in procs:
        times, errs = out.get(timeout=work.deadline - time.monotonic() + 120)
        done += times
        errors += errs
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"a client failed (exit {proc.exitcode})"
    end = max(done, default=start)
    return end - start, [t - start for t in done], errors


def rate_over_time(times: list[float], bucket_s: float) -> list[tuple[float, float]]:
    """(bucket start, acknowledged requests per second in it)."""
    if not times:
        return []
    buckets = [0] * (int(max(times) // bucket_s) + 1)
    for t in times:
        buckets[int(t // bucket_s)] += 1
    return [(i * bucket_s, n / bucket_s) for i, n in enumerate(buckets)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--submits", type=int, default=250)
    parser.add_argument(
        "--budget", type=float, default=120.0, help="seconds before the clients stop submitting"
    )
    args = parser.parse_args()
    print_conditions()
    total = args.clients * args.submits
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        daemon = RunningDaemon(root, simulate="1x24G").start()
        try:
            client = daemon.client()
            blocker = client.submit(["sleep", "3600"], cwd=root)  # a whole GPU
            daemon.wait_state(blocker.id, {"running"})
            sock, cwd = str(daemon.socket_path), str(root)
            ping_s, pings, _ = run_clients(
                Work(sock, "ping", args.submits, cwd, time.monotonic() + args.budget), args.clients
            )
            assert daemon.process is not None
            with profiled(daemon.process.pid, "throughput-daemon"):
                submit_s, submits, errors = run_clients(
                    Work(sock, "submit", args.submits, cwd, time.monotonic() + args.budget),
                    args.clients,
                )
        finally:
            daemon.stop()
            daemon.kill_jobs()
        store = Store(f"sqlite:///{root / 'gpusched.db'}")
        in_db = store.jobs.count() - 1  # less the blocker
        queued = sum(1 for job in store.jobs.active() if job.state == "queued")
        store.close()
    acked = len(submits)
    print(f"{args.clients} clients x {args.submits} requests each, at most {args.budget:.0f} s")
    print(f"  ping:   {len(pings) / ping_s:8.0f} requests/s ({len(pings)} in {ping_s:.2f} s)")
    print(
        f"  submit: {acked / submit_s:8.1f} submits/s  ({acked} acknowledged in {submit_s:.1f} s)"
    )
    print("  submits per second over time:")
    for begin, rate in rate_over_time(submits, 10.0):
        print(f"    {begin:5.0f}-{begin + 10:<5.0f} s  {rate:7.1f}/s")
    if errors:
        kinds: dict[str, int] = {}
        for message in errors:
            kinds[message[:140]] = kinds.get(message[:140], 0) + 1
        print(f"  {len(errors)} submits failed:")
        for message, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"    {n} x {message}")
    not_sent = total - acked - len(errors)
    if not_sent:
        print(f"  {not_sent} submits not sent: the {args.budget:.0f} s budget ran out")
    print(f"  recorded: {in_db} rows in the database ({queued} queued), {acked} acknowledged")
    report(
        "throughput",
        [
            Figure("submits per second (16 clients)", acked / submit_s, "/s"),
            Figure("pings per second (16 clients, baseline)", len(pings) / ping_s, "/s"),
            Figure("ping rate / submit rate", (len(pings) / ping_s) / (acked / submit_s), "x"),
            Figure("submits acknowledged", acked, "jobs", f"= {total}", acked == total),
            Figure("submits failed", len(errors), "jobs", "0", not errors),
            Figure(
                "acknowledged submits recorded in the database",
                in_db,
                "jobs",
                f"= {acked} acknowledged",
                in_db == acked,
            ),
        ],
    )


if __name__ == "__main__":
    main()
