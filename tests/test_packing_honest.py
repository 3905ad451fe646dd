"""The honest packing benchmark's quick mode runs and prints its whole report.

benchmarks/packing_honest.py --quick is one seed of a short trace: it holds no figure,
only that the script runs as a process end to end (every policy on a warm and a cold
day, the demand learned by the daemon's own trackers, each goal met or missed, the
RESULT line run_all.py reads). Its figures are the full run's (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "packing_honest.py"
POLICIES = ("default (contention)", "pack: memory", "best fit", "one job per GPU")


@pytest.fixture(scope="module")
def quick() -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_quick_mode_prints_every_policy_on_both_days_and_every_goal(quick: str) -> None:
    out = quick
    warm, cold = out.index("  warm history:"), out.index("  cold history:")
    assert warm < cold
    for day in (out[warm:cold], out[cold:]):
        header = day.splitlines()[1]
        for column in ("makespan h", "wait mean h", "p95 h", "slowdown"):
            assert column in header
        for policy in POLICIES:
            assert f"    {policy}" in day
    for goal in (
        "warm: one-per-GPU makespan / the default's",
        "warm: the default's mean slowdown",
        "warm: the default's mean wait / pack: memory's",
        "cold: the default's mean slowdown",
    ):
        line = next(line for line in out.splitlines() if goal in line and "(goal" in line)
        assert line.endswith((" met", " MISSED")), line
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    figures = json.loads(result.removeprefix("RESULT "))["figures"]
    assert len(figures) == 5
    assert all(isinstance(f["ok"], bool) for f in figures)


def test_a_missed_goal_says_what_stands_in_its_way(quick: str) -> None:
    # --quick's short trace cannot load the cards as the trace does: the load
    # check misses at least, and must say why.
    lines = quick.splitlines()
    missed = [i for i, line in enumerate(lines) if line.endswith(" MISSED")]
    assert missed
    for i in missed:
        assert lines[i + 1].startswith("    in the way: "), lines[i : i + 2]


def test_bad_arguments_are_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--jobs must be at least 2" in done.stderr
