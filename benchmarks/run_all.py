"""Run every benchmark, one after the other, and print one summary of every figure.

    python benchmarks/run_all.py                 # all of them, about 17 minutes
    python benchmarks/run_all.py packing idle    # some of them
    python benchmarks/run_all.py --json out.json # also write every figure and the machine

Each benchmark runs in its own process (its output streams through), so one failing
does not stop the others; the exit status is 1 if any failed to run. A missed target
is a figure, not a failure: it shows as MISS in the summary. Needs: gcc (the fake NVML
driver), task-spooler (`tsp`), hyperfine (optional: else a Python timing loop);
on Debian `apt-get install task-spooler hyperfine`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import RESULT_PREFIX, Figure, machine

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "packing",
    "packing_honest",
    "dispatch",
    "cli_latency",
    "throughput",
    "idle",
    "scheduling_pass",
    "status_queue",
    "dashboard",
    "http_peers",
    "database",
    "timeline_storage",
    "cluster",
    "cluster_drain",
    "cluster_liveness",
    "cluster_cancel",
    "soaks",
)


def run_one(name: str) -> tuple[dict[str, Any] | None, float]:
    print(f"\n##### {name} " + "#" * (60 - len(name)), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / f"{name}.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    result = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
        else:
            print(line, end="", flush=True)
    proc.wait()
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"!!! {name} failed (exit {proc.returncode}) after {elapsed:.0f} s")
        return None, elapsed
    return result, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--json", type=Path, help="write every figure and the machine here")
    args = parser.parse_args()
    names = args.names or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    info = machine()
    began = datetime.now(timezone.utc)
    print(f"gpusched benchmarks, {began:%Y-%m-%d %H:%M} UTC")
    for key, value in info.items():
        print(f"{key}: {value}")
    results: dict[str, Any] = {}
    failed = []
    durations = {}
    for name in names:
        result, durations[name] = run_one(name)
        if result is None:
            failed.append(name)
        else:
            results[name] = result
    print("\n" + "=" * 100 + "\nSUMMARY")
    for name in names:
        print(f"\n{name} ({durations[name]:.0f} s)")
        if name in failed:
            print("  FAILED TO RUN")
            continue
        for data in results[name]["figures"]:
            print(Figure(**data).line())
    total = sum(durations.values())
    print(f"\nall benchmarks: {total:.0f} s; load average now {info.get('load average at start')}")
    if args.json:
        payload = {"date": began.isoformat(), "machine": info, "results": results}
        args.json.write_text(json.dumps(payload, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
