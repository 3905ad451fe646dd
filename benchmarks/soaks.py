"""The soaks: the suite's load tests at the sizes that take minutes, one command.

The suite runs each of these at a size that proves its rule in seconds; here they run
at the size that shows it holds for long (their outcome checks are the tests' own, so
there is one copy of what must hold):

- SIGKILL restarts under 16 concurrent submitting clients, 2,000 jobs through 6 kills
  (tests/test_stress.py: none acknowledged lost, none run twice, every exit code right);
- randomized faults on a three-daemon cluster behind fault proxies, 10 rounds
  (tests/test_partitions_stress.py; GPUSCHED_FAULT_SEED replays a seed's rounds);
- three daemons racing over one queue of 1,000 short jobs, on PostgreSQL and on SQLite
  (tests/test_cluster_race.py: each job once, no card overcommitted).

    python benchmarks/soaks.py [--jobs 2000] [--restarts 6] [--rounds 10] [--race 1000]

Figures: each soak's wall time and the jobs per second it printed; a soak whose checks
fail is a failed run (exit 1), not a figure. Needs what the suite needs (gcc, PostgreSQL).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from _common import REPO_ROOT, Figure, print_conditions, report

SOAKS = (
    ("restarts", "tests/test_stress.py", r"\(([\d.]+) jobs/s\)"),
    ("faults", "tests/test_partitions_stress.py", None),
    ("race", "tests/test_cluster_race.py", r"(\d+) jobs on 3 daemons: ([\d.]+) s"),
)


def _run(name: str, path: str, env: dict[str, str]) -> tuple[bool, float, str]:
    """One soak through pytest (its output printed once it ends): passed, seconds, what
    it printed."""
    print(f"\n### {name}: {path}", flush=True)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", path],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - began
    print(done.stdout[-6000:], done.stderr[-2000:], sep="\n", flush=True)
    return done.returncode == 0, took, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs of the restarts soak")
    parser.add_argument("--restarts", type=int, default=6, help="its SIGKILLs")
    parser.add_argument("--rounds", type=int, default=10, help="fault rounds on the cluster")
    parser.add_argument("--race", type=int, default=1000, help="jobs of the cluster race")
    args = parser.parse_args()
    print_conditions()
    env = {
        **os.environ,
        "GPUSCHED_STRESS_JOBS": str(args.jobs),
        "GPUSCHED_STRESS_RESTARTS": str(args.restarts),
        "GPUSCHED_FAULT_ROUNDS": str(args.rounds),
        "CLUSTER_RACE_JOBS": str(args.race),
    }
    figures: list[Figure] = []
    failed: list[str] = []
    for name, path, rate in SOAKS:
        passed, took, printed = _run(name, path, env)
        if not passed:
            failed.append(name)
        figures.append(Figure(f"{name}: wall time", took, "s"))
        for count, found in enumerate(re.findall(rate, printed) if rate else [], 1):
            if name == "race":  # one race per database, in the test's order
                figures.append(Figure(f"race {count}: {found[0]} jobs took", float(found[1]), "s"))
            else:
                figures.append(Figure(f"{name}: jobs a second", float(found), "jobs/s"))
    report("soaks", figures, {"failed": failed})
    if failed:
        print(f"soaks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
