"""Helpers shared by the benchmark scripts (not a benchmark itself).

Every script can run alone (`python benchmarks/packing.py`) or under `run_all.py`.
Each ends by printing one line `RESULT {...json...}`: its figures, each with its
target and whether it was met, which `run_all.py` collects into one summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `tests.daemon_harness`, `tests.fakenvml` from any cwd
    sys.path.append(str(REPO_ROOT))  # appended: PYTHONPATH may point at another gpusched

GiB = 2**30
RESULT_PREFIX = "RESULT "

# Measure gpusched as installed, with its bytecode cached: this environment sets
# PYTHONDONTWRITEBYTECODE=1, which would make every CLI call and every job supervisor
# compile gpusched's sources again. The cache goes to a private prefix, never into the
# source tree. Every process these scripts start (daemons, CLIs, supervisors) inherits it.
BYTECODE_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "gpusched-bench-pycache"
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("PYTHONPYCACHEPREFIX", str(BYTECODE_CACHE))


@dataclass
class Figure:
    """One reported number, optionally with a target (`ok` is None when there is none)."""

    name: str
    value: float
    unit: str
    target: str | None = None
    ok: bool | None = None

    def line(self) -> str:
        verdict = "" if self.ok is None else ("  PASS" if self.ok else "  MISS")
        target = f"  (target {self.target})" if self.target else ""
        return f"  {self.name:<52} {self.value:>12.4g} {self.unit:<10}{target}{verdict}"


def report(benchmark: str, figures: list[Figure], extra: dict[str, Any] | None = None) -> None:
    """Print the figures and the machine-readable RESULT line."""
    print(f"\n== {benchmark}: figures ==")
    for figure in figures:
        print(figure.line())
    payload = {
        "benchmark": benchmark,
        "figures": [figure.__dict__ for figure in figures],
        **(extra or {}),
    }
    print(RESULT_PREFIX + json.dumps(payload), flush=True)


def median_time(fn: Callable[[], object], runs: int, warmup: int = 2) -> tuple[float, list[float]]:
    """Median wall time of `fn()` in seconds over `runs` runs, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def machine() -> dict[str, str]:
    """What the figures were measured on."""

    def run(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "(unavailable)"

    return {
        "nproc": run("nproc"),
        "lscpu": "\n".join(run("lscpu").splitlines()[:10]),
        "memory": run("free", "-h"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "kernel": os.uname().release,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def print_conditions() -> None:
    """The machine's load now: other processes on a 2-core machine move every timing."""
    one, five, _ = os.getloadavg()
    print(f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs")


PROFILE_ENV = "GPUSCHED_BENCH_PROFILE"


@contextlib.contextmanager
def profiled(pid: int, name: str) -> Iterator[None]:
    """With GPUSCHED_BENCH_PROFILE=DIR set, sample process `pid` with py-spy meanwhile.

    Writes DIR/NAME.folded (collapsed stacks, idle threads included, 250 Hz, without
    pausing the process: a pausing sampler stretches lock hold times): what the
    daemon was doing during the timed part. Off by default: sampling costs CPU.
    """
    out_dir = os.environ.get(PROFILE_ENV)
    spy = shutil.which("py-spy")
    if not out_dir or spy is None:
        yield
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    out = Path(out_dir) / f"{name}.folded"
    argv = [spy, "record", "-p", str(pid), "-r", "250", "--idle", "--nonblocking"]
    argv += ["-f", "raw", "-o", str(out)]  # nonblocking: never pause the daemon
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"  profile of pid {pid}: {out}")
