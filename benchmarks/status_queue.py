"""`status` over a long queue: 10,000 waiting jobs against 100, each measured in the same run.

For each queue length a real daemon (the two side by side, measured in rounds;
`simulate: 4x80G`, SQLite) starts over a database already holding that many queued jobs
(written through `gpusched.store`'s `jobs` table in one transaction, each with this
process's real environment), every one declaring more memory than any GPU has, so
nothing starts and every tick explains why each waits. Then:

- the API's `status`, one page (`Client().request("status")`, what the dashboard asks
  for), median of RUNS calls in this process: a default page (up to the daemon's page
  size: 100 jobs against a full page, reported) and a page of the short queue's length
  for both (`limit`, like for like: held to the goal);
- the API's `status`, every page joined (`Client().status_reply()`, what `--json` does):
  reported, not held to the ratio, since it lists 100 times the jobs; with the bytes of
  its largest wire reply;
- `gpusched status` (the text: every running job, one page of waiting ones, a count of
  the rest) as a fresh process, median of RUNS.

Issue 30's goals: `status` with 10,000 queued at most 2x the same with 100; every wire
reply bounded (1 MiB, gpusched.core.requests.protocol.WIRE_REPLY_BYTES).

    python benchmarks/status_queue.py [--runs 10] [--long 10000] [--short 100]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import Figure, GiB, print_conditions, report

from gpusched import __version__
from gpusched.client import Client
from gpusched.core.requests.protocol import (
    VERSION_FIELD,
    WIRE_REPLY_BYTES,
    decode,
    encode,
    read_frame,
)
from gpusched.store import Store, jobs
from tests.daemon_harness import RunningDaemon

STATUS_TARGET = 2.0


def fill_queue(database_url: str, n_queued: int, cwd: str) -> None:
    store = Store(database_url)
    env = dict(os.environ)
    rows = [
        {
            "name": f"sweep-{i}" if i % 3 == 0 else None,
            "user": "bench",
            "uid": os.getuid(),
            "gid": os.getgid(),
            "state": "queued",
            "command": ["python", "train.py", "--lr", f"0.{i % 97:03d}"],
            "cwd": cwd,
            "env": env,
            "umask": 0o022,
            "mem": 96 * GiB,  # over every GPU's 80 GB: it waits, with a reason
            "gpus": 1,
            "gpu_indices": [],
            "gpu_uuids": [],
            "priority": 0,
            "after": [],
            "submitted_at": "2026-11-26T10:00:00.000+00:00",
            "hints": [],
        }
        for i in range(n_queued)
    ]
    with store.database.engine.begin() as conn:
        conn.execute(jobs.insert(), rows)
    store.close()


def largest_reply(sock_path: Path) -> int:
    """Bytes of the largest `status` page on the wire, walking every page."""
    largest, cursor = 0, None
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(sock_path))
            sock.sendall(encode({"op": "status", VERSION_FIELD: __version__, "cursor": cursor}))
            frame = read_frame(sock, bytearray(), limit=64 * 2**20)
        assert frame is not None
        largest = max(largest, len(frame))
        cursor = decode(frame, limit=64 * 2**20)["result"]["next"]
        if cursor is None:
            return largest


def measure(sizes: list[int], runs: int, script: Path) -> list[dict[str, float]]:
    """Each queue length's figures. Their daemons run side by side and every figure is
    taken in rounds, one call to each daemon per round: on a shared machine a change in
    load then falls on both queue lengths alike (the long queue's passes load the
    machine for the short one's calls too)."""
    with contextlib.ExitStack() as stack:
        daemons = []
        for n_queued in sizes:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpusched-bench-")))
            daemon = RunningDaemon(root, simulate="4x80G")
            fill_queue(f"sqlite:///{root / 'gpusched.db'}", n_queued, str(root))
            daemons.append(daemon.start())
            stack.callback(daemon.stop)
        clients = [Client(daemon.socket_path) for daemon in daemons]
        envs = []
        for daemon in daemons:
            env = {k: v for k, v in daemon.env.items() if k != "GPUSCHED_CONFIG"}
            env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
            envs.append(env)

        def cli(env: dict[str, str]) -> Callable[[], object]:
            return lambda: subprocess.run(
                [str(script), "status"], env=env, check=True, stdout=subprocess.DEVNULL
            )

        calls: dict[str, list[Callable[[], object]]] = {
            "page_s": [functools.partial(c.request, "status") for c in clients],
            # The same page size for both (the short queue's length): like for like.
            "same_page_s": [
                functools.partial(c.request, "status", limit=min(sizes)) for c in clients
            ],
            "api_s": [c.status_reply for c in clients],
            "cli_s": [cli(env) for env in envs],
        }
        samples: dict[str, list[list[float]]] = {k: [[] for _ in sizes] for k in calls}
        for key, fns in calls.items():
            for fn in fns:
                fn()  # warm-up
            for _ in range(runs):
                for i, fn in enumerate(fns):
                    start = time.perf_counter()
                    fn()
                    samples[key][i].append(time.perf_counter() - start)
        return [
            {
                **{key: statistics.median(samples[key][i]) for key in calls},
                "listed": len(clients[i].status_reply()["jobs"]),
                "largest_reply": largest_reply(daemons[i].socket_path),
            }
            for i in range(len(sizes))
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--long", type=int, default=10_000)
    parser.add_argument("--short", type=int, default=100)
    args = parser.parse_args()
    print_conditions()
    script = Path(sys.executable).with_name("gpusched")
    short, long = measure([args.short, args.long], args.runs, script)
    figures = []
    for label, result in ((args.short, short), (args.long, long)):
        print(
            f"{label} queued: API status, a page {1e3 * result['page_s']:.1f} ms, every page"
            f" {1e3 * result['api_s']:.1f} ms ({result['listed']} jobs listed),"
            f" gpusched status {1e3 * result['cli_s']:.1f} ms, largest reply"
            f" {result['largest_reply'] / 1e3:.0f} kB"
        )
        figures += [
            Figure(f"API status, one page, {label} queued", 1e3 * result["page_s"], "ms"),
            Figure(f"API status, every page, {label} queued", 1e3 * result["api_s"], "ms"),
            Figure(f"gpusched status, {label} queued", 1e3 * result["cli_s"], "ms"),
            Figure(
                f"largest status reply, {label} queued",
                result["largest_reply"],
                "bytes",
                f"<= {WIRE_REPLY_BYTES}",
                result["largest_reply"] <= WIRE_REPLY_BYTES,
            ),
        ]
    every = long["api_s"] / short["api_s"]
    figures.append(Figure(f"API status, every page, {args.long} / {args.short}", every, "x"))
    # A default page lists up to the daemon's page size (100 jobs of the short queue against
    # a full page of the long one): reported. Held to the goal: the same page size, and the
    # text `status` (one page of waiting jobs and a count either way).
    page = long["page_s"] / short["page_s"]
    figures.append(Figure(f"API status (a default page), {args.long} / {args.short}", page, "x"))
    for what, key in (
        (f"API status (a page of {args.short})", "same_page_s"),
        ("gpusched status (text)", "cli_s"),
    ):
        ratio = long[key] / short[key]
        figures.append(
            Figure(
                f"{what}, {args.long} / {args.short} queued",
                ratio,
                "x",
                f"<= {STATUS_TARGET:g}",
                ratio <= STATUS_TARGET,
            )
        )
    report("status_queue", figures)


if __name__ == "__main__":
    main()
