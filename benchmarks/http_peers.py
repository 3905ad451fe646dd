"""A /metrics scrape's latency with 5,000 unrelated loopback connections open, against none.

The per-user HTTP cap finds a loopback client's uid by asking the kernel for that one
socket (gpusched/daemon/tcp_peers.py), in the accept loop: what it costs must not grow
with the sockets other users hold. One daemon with `metrics:`; this script holds
--connections idle loopback connections of its own (both ends, none to gpusched),
in rounds alternating with none open (each closed with a reset, so no TIME_WAIT is
left behind). A scrape is a fresh connection: connect, GET /metrics, read to the close.
Median and p95 of every scrape in each state, and loaded / none.

With --baseline-tree DIR (a checkout of another commit, e.g. from `git archive`), a
second daemon runs that tree's gpusched and is scraped in the same rounds.

    python benchmarks/http_peers.py [--connections 5000] [--scrapes 20] [--rounds 3]
        [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from _common import Figure, print_conditions, report

from tests.daemon_harness import RunningDaemon

BASELINE = " (baseline)"
MEDIAN_GOAL = 1.5  # loaded / none: the lookup is one hash lookup in the kernel either way


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def enough_files(connections: int) -> None:
    """Both ends of every held connection are ours: raise RLIMIT_NOFILE (root: its hard
    limit too) to hold them."""
    need = 2 * connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
        except (ValueError, OSError):
            sys.exit(f"{need} open files needed, the hard limit is {hard}: run as root")
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def hold(count: int) -> list[socket.socket]:
    """`count` established loopback connections, both ends, to a listener of ours."""
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        address = listener.getsockname()
        for _ in range(count):
            client = socket.create_connection(address)
            server, _ = listener.accept()
            held += [client, server]
    return held


def let_go(held: list[socket.socket]) -> None:
    reset = struct.pack("ii", 1, 0)  # linger 0: a reset, no TIME_WAIT socket left behind
    for sock in held:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        sock.close()
    held.clear()


def scrape(port: int) -> float:
    """Seconds from connecting to the last byte of a /metrics reply."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    elapsed = time.perf_counter() - start
    assert data.startswith(b"HTTP/1.0 200"), data[:200]
    return elapsed


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


def start(root: Path, tree: Path | None) -> tuple[RunningDaemon, int]:
    root.mkdir()
    port = free_port()
    env = None if tree is None else {"PYTHONPATH": str(tree)}
    config = {"metrics": f"127.0.0.1:{port}"}
    daemon = RunningDaemon(root, simulate="2x24G", config=config, env=env).start()
    scrape(port)  # warm-up: the first reply imports and computes what later ones reuse
    return daemon, port


def measure(ports: dict[str, int], args: argparse.Namespace) -> dict[str, list[float]]:
    """Every scrape's seconds, by daemon and state, in alternated rounds."""
    samples: dict[str, list[float]] = {}
    held: list[socket.socket] = []
    try:
        for round_number in range(args.rounds):
            for state in ("none", "loaded"):
                if state == "loaded":
                    began = time.perf_counter()
                    held = hold(args.connections)
                    opened = time.perf_counter() - began
                    print(f"round {round_number + 1}: {args.connections} held ({opened:.1f} s)")
                for suffix, port in ports.items():
                    times = [scrape(port) for _ in range(args.scrapes)]
                    samples.setdefault(f"{state}{suffix}", []).extend(times)
                let_go(held)
    finally:
        let_go(held)
    return samples


def figures_of(samples: dict[str, list[float]], suffix: str, connections: int) -> list[Figure]:
    none, loaded = samples[f"none{suffix}"], samples[f"loaded{suffix}"]
    figures = []
    for name, times in ((f"{connections} held", loaded), ("none held", none)):
        median_ms = 1e3 * statistics.median(times)
        figures.append(Figure(f"/metrics median, {name}{suffix}", median_ms, "ms"))
        figures.append(Figure(f"/metrics p95, {name}{suffix}", 1e3 * p95(times), "ms"))
    median = statistics.median(loaded) / statistics.median(none)
    tail = p95(loaded) / p95(none)
    goal = None if suffix else f"<= {MEDIAN_GOAL}"
    ok = None if suffix else median <= MEDIAN_GOAL
    figures.append(Figure(f"median, {connections} held / none{suffix}", median, "x", goal, ok))
    figures.append(Figure(f"p95, {connections} held / none{suffix}", tail, "x"))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--scrapes", type=int, default=20, help="per daemon, state and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, help="also scrape that tree's daemon")
    args = parser.parse_args()
    tree = None if args.baseline_tree is None else args.baseline_tree.resolve()
    if tree is not None and not (tree / "gpusched" / "__init__.py").is_file():
        sys.exit(f"--baseline-tree {tree}: no gpusched package there")
    enough_files(args.connections)
    print_conditions()
    daemons: list[RunningDaemon] = []
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        # `python -m gpusched` puts its working directory first on sys.path: started from
        # this checkout, the baseline daemon would import this tree, not PYTHONPATH's.
        os.chdir(tmp)
        try:
            trees = {"": None} if tree is None else {"": None, BASELINE: tree}
            ports = {}
            for suffix, each in trees.items():
                daemon, ports[suffix] = start(Path(tmp) / f"daemon{len(daemons)}", each)
                daemons.append(daemon)
            samples = measure(ports, args)
        finally:
            for daemon in daemons:
                daemon.stop()
    count = args.rounds * args.scrapes
    print(f"{count} scrapes a daemon and state; {args.connections} connections held or none")
    figures = [fig for suffix in ports for fig in figures_of(samples, suffix, args.connections)]
    report("http_peers", figures)


if __name__ == "__main__":
    main()
