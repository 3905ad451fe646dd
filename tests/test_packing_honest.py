"""The honest packing benchmark: its quick mode prints its whole report, and its
simulation tells the policy only what the daemon's own code learned.

benchmarks/packing_honest.py --quick is one seed of a short trace: it holds no figure,
only that the script runs as a process end to end (every policy on a warm and a cold
day, each goal met or missed, the RESULT line run_all.py reads). Its figures are the
full run's (docs/benchmarks.md). The small traces below hold the simulation to no
oracle: a job's first run is unknown to the policy, a name's history can mislead it,
and what the trackers read on a shared card is what the daemon's DemandTracker makes of
the readings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _honest_sim import Day, DayResult
from _honest_trace import GiB, Job
from _packing_policies import DEFAULT, MEMORY, Policy

from gpusched.usage.demand_history import DemandHistory

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
    # --quick's short trace cannot load the cards as the full one does: the load
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


def job(job_id: int, name: str, arrival_s: float, demand: float) -> Job:
    kind = "busy" if demand >= 0.5 else "starved"
    return Job(
        job_id, "alice", 1000, name, arrival_s, 1, 10 * GiB, 8 * GiB, 600.0, kind, demand, False
    )


def day(trace: list[Job], policy: Policy = DEFAULT) -> DayResult:
    return Day(trace, policy, 1, 2000.0, DemandHistory([])).run()


def test_a_first_run_is_unknown_and_the_next_is_told_what_its_tracker_read() -> None:
    result = day([job(1, "alice/train", 0.0, 0.9), job(2, "alice/train", 1000.0, 0.9)])
    assert result.told == ["unknown", "right"]
    assert [read for read, _ in result.learned] == pytest.approx([0.9, 0.9], abs=0.01)


def test_a_names_history_misleads_until_the_job_is_polled() -> None:
    result = day([job(1, "alice/train", 0.0, 0.1), job(2, "alice/train", 1000.0, 0.95)])
    assert result.told == ["unknown", "wrong"]
    assert [read for read, _ in result.learned] == pytest.approx([0.1, 0.95], abs=0.01)


def test_two_busy_jobs_on_one_card_are_read_busy_from_their_turns() -> None:
    # The card reads 100 % and each obtains about half of it: the daemon's tracker reads
    # that as wanting the whole card, never as a demand of one half.
    result = day([job(1, "alice/a", 0.0, 0.9), job(2, "alice/b", 0.0, 0.9)], MEMORY)
    assert [read for read, _ in result.learned] == [1.0, 1.0]
    assert min(result.slowdowns) > 1.5
