"""The packing benchmark's results and how packing.py prints them (not a benchmark itself).

`SimResult` is one policy's run of one mix; `print_fit` prints the sharing model against the
measured table, `print_mix` a mix's table of policies and where the default's slowdown comes
from (_packing_breakdown.py), `goals` the issue's goals for the default with PASS/MISS.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from _common import Figure
from _packing_breakdown import Exposure, lines
from _packing_model import FIT_BOUND, fit_errors
from _packing_policies import DEFAULT, ONE_PER_GPU, Policy

# The goals for the default policy.
LAB_MAKESPAN_GAIN = 1.3  # one-per-GPU makespan / the default's, at least
LAB_MEAN_SLOWDOWN = 1.1  # at most


@dataclass
class SimResult:
    policy: Policy
    makespan_s: float
    slowdowns: list[float]
    waits_s: list[float]
    oom_kills: int
    plan_calls: int
    plan_s: float
    most_on_a_card: int
    held_for_quiet: int = 0  # jobs the contention rule kept off busy cards at least once
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # slowdowns per kind
    exposures: list[Exposure] = field(default_factory=list)  # per trace job, its last run

    @property
    def mean_slowdown(self) -> float:
        return statistics.fmean(self.slowdowns)

    @property
    def p95_slowdown(self) -> float:
        ordered = sorted(self.slowdowns)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(self.waits_s)


def print_fit() -> float:
    """The sharing model against the measured table; returns the largest error."""
    print("sharing model vs the H200 table (each job's speed vs alone):")
    worst = 0.0
    for row in fit_errors():
        measured = ", ".join(f"{x:.3f}" for x in row.measured)
        modelled = ", ".join(f"{x:.3f}" for x in row.modelled)
        print(f"  {row.row:<8} measured {measured:<30} model {modelled:<30} error {row.error:.4f}")
        worst = max(worst, row.error)
    verdict = "PASS" if worst <= FIT_BOUND else "MISS"
    print(f"  largest error {worst:.4f} (bound {FIT_BOUND}) {verdict}")
    return worst


def print_mix(mix: str, results: list[SimResult]) -> None:
    whole = next(r for r in results if r.policy == ONE_PER_GPU)
    print(
        f"  {'policy':<22}{'makespan h':>11}{'one-per-GPU/it':>15}{'slowdown mean':>14}"
        f"{'p95':>7}{'vs one-per-GPU':>15}{'mean wait h':>12}{'OOM':>5}{'most/card':>10}"
        f"{'held':>6}"
    )
    for r in results:
        print(
            f"  {r.policy.name:<22}{r.makespan_s / 3600:>11.2f}"
            f"{whole.makespan_s / r.makespan_s:>15.3f}{r.mean_slowdown:>14.3f}"
            f"{r.p95_slowdown:>7.3f}{r.mean_slowdown / whole.mean_slowdown:>15.3f}"
            f"{r.mean_wait_s / 3600:>12.2f}{r.oom_kills:>5}{r.most_on_a_card:>10}"
            f"{r.held_for_quiet:>6}"
        )
    default = next(r for r in results if r.policy == DEFAULT)
    kinds = "  ".join(
        f"{kind} {statistics.fmean(values):.3f}" for kind, values in sorted(default.by_kind.items())
    )
    print(f"  default's mean slowdown by kind: {kinds}")
    print("  default's slowdown by what each job's last run met on its cards:")
    for line in lines(zip(default.exposures, default.slowdowns, strict=True)):
        print(line)


def goals(by_mix: dict[str, list[SimResult]]) -> list[Figure]:
    """The issue's goals for the default policy, where their mix was run."""
    figures = []
    if "lab" in by_mix:
        whole = next(r for r in by_mix["lab"] if r.policy == ONE_PER_GPU)
        default = next(r for r in by_mix["lab"] if r.policy == DEFAULT)
        gain = whole.makespan_s / default.makespan_s
        figures.append(
            Figure(
                "lab, default: one-per-GPU makespan / its",
                gain,
                "x",
                f">= {LAB_MAKESPAN_GAIN}",
                gain >= LAB_MAKESPAN_GAIN,
            )
        )
        slow = default.mean_slowdown
        figures.append(
            Figure(
                "lab, default: mean slowdown",
                slow,
                "x",
                f"<= {LAB_MEAN_SLOWDOWN}",
                slow <= LAB_MEAN_SLOWDOWN,
            )
        )
    if "all-busy" in by_mix:
        whole = next(r for r in by_mix["all-busy"] if r.policy == ONE_PER_GPU)
        default = next(r for r in by_mix["all-busy"] if r.policy == DEFAULT)
        ratio = default.mean_slowdown / whole.mean_slowdown
        figures.append(
            Figure(
                "all-busy, default: mean slowdown / one-per-GPU's",
                ratio,
                "x",
                "<= 1.0",
                ratio <= 1.0 + 1e-9,
            )
        )
    return figures
