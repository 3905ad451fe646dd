"""Churn: N minutes of short jobs (`sleep 0.2`, 8 in flight) through one daemon
(`simulate: 2x24G`, SQLite); prints the largest lag between a job's exit and its
recorded end (tests/crowd_load.py: its `ended_at` past its recorded start plus the run
its supervisor measured, an upper bound), and any job whose end was never recorded.

Goal: every end recorded within 2 s.

    python benchmarks/churn.py [--seconds 120] [--in-flight 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import Figure, print_conditions, report

from tests.crowd_load import churn
from tests.daemon_harness import RunningDaemon

LAG_TARGET_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--in-flight", type=int, default=8)
    args = parser.parse_args()
    print_conditions()
    with tempfile.TemporaryDirectory(prefix="gpusched-churn-") as tmp:
        daemon = RunningDaemon(Path(tmp)).start()
        try:
            seen = churn(daemon.socket_path, args.seconds, Path(tmp), args.in_flight)
        finally:
            daemon.stop()
            daemon.kill_jobs()
    largest = seen.largest_lag_s
    report(
        "churn",
        [
            Figure("jobs", seen.jobs, "jobs"),
            Figure("ends never recorded", len(seen.unrecorded), "jobs", "0", not seen.unrecorded),
            Figure("median lag", statistics.median(seen.lags_s or [0.0]), "s"),
            Figure("largest lag", largest, "s", f"<= {LAG_TARGET_S:g}", largest <= LAG_TARGET_S),
        ],
        {"seconds": args.seconds, "in_flight": args.in_flight},
    )


if __name__ == "__main__":
    main()
