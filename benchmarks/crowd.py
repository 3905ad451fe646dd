"""A crowd: 50 clients submitting (held jobs) and reading `status` at once for 2 minutes,
beside 2 CPU-bound processes, against one daemon (`simulate: 2x24G`, SQLite). Prints
the requests refused, the internal errors, and the p50 and p99 of the answered ones.

Goals: 0 refused, 0 internal errors.

    python benchmarks/crowd.py [--clients 50] [--seconds 120] [--burners 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
from pathlib import Path

from _common import Figure, print_conditions, report

from tests.crowd_load import crowd
from tests.daemon_harness import RunningDaemon


def burn() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--burners", type=int, default=2)
    args = parser.parse_args()
    print_conditions()
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    with tempfile.TemporaryDirectory(prefix="gpusched-crowd-") as tmp:
        daemon = RunningDaemon(Path(tmp)).start()
        for b in burners:
            b.start()
        try:
            seen = crowd(daemon.socket_path, args.clients, args.seconds, Path(tmp))
        finally:
            for b in burners:
                b.terminate()
            daemon.stop()
    for message in sorted(set(seen.refused + seen.internal))[:5]:
        print(f"  e.g. {message}")
    report(
        "crowd",
        [
            Figure("requests", seen.requests, "requests"),
            Figure("refused", len(seen.refused), "requests", "0", not seen.refused),
            Figure("internal errors", len(seen.internal), "requests", "0", not seen.internal),
            Figure("p50", seen.percentile(0.50) * 1000, "ms"),
            Figure("p99", seen.percentile(0.99) * 1000, "ms"),
        ],
        {"clients": args.clients, "seconds": args.seconds, "burners": args.burners},
    )


if __name__ == "__main__":
    main()
