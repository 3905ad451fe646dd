"""Dashboard response time: its JSON and its page with 10,000 ended jobs in the database.

Two daemons on four simulated 80G GPUs, each with `web:` on a port of its own: one with
10,000 ended jobs in its history (written before it starts, as cli_latency.py does), the
baseline with 100. Each has a few running and waiting jobs besides. Timed, on a fresh
HTTP connection per request as a browser's poll makes it, median of RUNS:

- GET /api/status (GPUs, running and waiting jobs, the last ends): what the GPU and queue
  pages poll every two seconds; GET /api/usage (fair share's figures); GET /api/job?id=N;
- GET / (the page itself, served from memory);
- `status` over the Unix socket (the CLI's request, without the CLI's start-up), beside.

A JSON reply is kept for a second and shared by every viewer (web/site.py), so each
timed request of an API waits out that second first: what is timed is the daemon
computing the reply, not the cache. The cached reply is timed too, back to back.

    python benchmarks/dashboard.py [--runs 15] [--ended 10000]
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import tempfile
import time
from pathlib import Path

from _common import Figure, print_conditions, report
from cli_latency import fill_history

from tests.daemon_harness import RunningDaemon

CACHE_S = 1.0  # gpusched.daemon.web.site.CACHE_S
BASELINE_ENDED = 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(port: int, path: str) -> float:
    """Seconds from connecting to the last byte of the reply."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    elapsed = time.perf_counter() - start
    assert response.status == 200, (path, response.status)
    assert body, path
    return elapsed


def timed(port: int, path: str, runs: int, fresh: bool) -> float:
    """Median seconds of GET path; `fresh`: each after the cache's second has passed."""
    fetch(port, path)  # warm-up
    samples = []
    for _ in range(runs):
        if fresh:
            time.sleep(CACHE_S + 0.05)
        samples.append(fetch(port, path))
    return statistics.median(samples)


def socket_status(daemon: RunningDaemon, runs: int) -> float:
    client = daemon.client()
    client.status_reply(all=True)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        client.status_reply(all=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def start(root: Path, ended: int) -> tuple[RunningDaemon, int]:
    port = free_port()
    daemon = RunningDaemon(root, simulate="4x80G", config={"web": f"127.0.0.1:{port}"})
    began = time.perf_counter()
    fill_history(f"sqlite:///{root / 'gpusched.db'}", ended, str(root))
    print(f"{ended} ended jobs written in {time.perf_counter() - began:.1f} s")
    daemon.start()
    for _ in range(4):  # one running job per GPU
        daemon.submit("--mem", "60G", "--", "sleep", "600")
    for _ in range(8):  # and a queue behind them
        daemon.submit("--mem", "60G", "--", "sleep", "600")
    return daemon, port


def measure(daemon: RunningDaemon, port: int, runs: int) -> dict[str, float]:
    newest = daemon.status("--all")["jobs"][-1]["id"]
    return {
        "/api/status": timed(port, "/api/status", runs, fresh=True),
        "/api/status (cached)": timed(port, "/api/status", runs, fresh=False),
        "/api/usage": timed(port, "/api/usage", runs, fresh=True),
        "/api/job": timed(port, f"/api/job?id={newest}", runs, fresh=True),
        "/ (page)": timed(port, "/", runs, fresh=False),
        "status over the socket": socket_status(daemon, runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--ended", type=int, default=10_000)
    args = parser.parse_args()
    print_conditions()
    results: dict[int, dict[str, float]] = {}
    for ended in (BASELINE_ENDED, args.ended):
        with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
            daemon, port = start(Path(tmp), ended)
            try:
                results[ended] = measure(daemon, port, args.runs)
            finally:
                daemon.stop()
                daemon.kill_jobs()
    base, big = results[BASELINE_ENDED], results[args.ended]
    print(f"medians of {args.runs} requests (ms), {BASELINE_ENDED} vs {args.ended} ended jobs:")
    for name in big:
        print(f"  {name:<26} {1e3 * base[name]:8.2f} {1e3 * big[name]:8.2f}")
    figures = []
    for name in ("/api/status", "/api/usage", "/api/job", "/ (page)"):
        figures.append(Figure(f"{name}, {args.ended} ended", 1e3 * big[name], "ms"))
    ratio = big["/api/status"] / base["/api/status"]
    figures.append(
        Figure(
            f"/api/status: {args.ended} / {BASELINE_ENDED} ended",
            ratio,
            "x",
            "<= 1.5",
            ratio <= 1.5,
        )
    )
    ratio = big["/api/status"] / big["status over the socket"]
    figures.append(
        Figure("/api/status / socket status, same daemon", ratio, "x", "<= 3", ratio <= 3)
    )
    figures.append(Figure("/api/status, cached", 1e3 * big["/api/status (cached)"], "ms"))
    page = big["/ (page)"] / base["/ (page)"]
    figures.append(Figure(f"page: {args.ended} / {BASELINE_ENDED} ended", page, "x"))
    report("dashboard", figures)


if __name__ == "__main__":
    main()
