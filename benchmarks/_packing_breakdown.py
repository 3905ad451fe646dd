"""Where a policy's slowdown comes from, in the packing benchmark (packing.py prints it).

A job's slowdown is its last run time over its run time alone; the mean's excess over 1
is the sum of each job's (slowdown - 1) over all jobs. `Breakdown` splits that excess by
what the job met on its cards during its last run:

  alone                 it never shared a card
  light + light         a light job (demand < 50 %) that shared only with light jobs
  light + busy          a light job that shared a card with a busy one at some time
  busy + light          a busy job (>= 50 %, memory-bound included) beside light ones only
  busy + busy           a busy job that shared a card with another busy one, split by how
                        the pair was made: the job that joined had no history
                        ("unknown joined"), the job already there had no measured demand
                        yet and no history ("unknown there"), the job that joined had no
                        history of its own and its owner's latest runs misled
                        ("owner's runs joined"), or both were known
                        ("both known": a busy job the rule let join, e.g. a light one
                        misjudged, or a multi-GPU set)

Cross-cutting lines (the same jobs, counted again): multi-GPU jobs, and OOM-retried jobs
(whose slowdown is their last run's, the lost attempt counted as wait, not slowdown).
Light and busy here are the job's true demand, not what the policy knew.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

BUSY = 0.5  # the policy's BUSY_DEMAND: a job at or above this keeps a card busy

ORDER = (
    "alone",
    "light + light",
    "light + busy",
    "busy + light",
    "busy + busy: unknown joined",
    "busy + busy: unknown there",
    "busy + busy: owner's runs joined",
    "busy + busy: both known",
)


@dataclass
class Exposure:
    """What one run met on its cards (the simulation fills it as jobs are placed)."""

    busy: bool  # its true demand is busy
    gpus: int
    retried: bool = False  # an OOM retry
    shared: bool = False
    beside_busy: bool = False
    busy_pairs: set[str] = field(default_factory=set)  # how each busy + busy pair was made

    def met(
        self,
        other: Exposure,
        *,
        joined_unknown: bool,
        there_unknown: bool,
        joined_by_owner: bool = False,
    ) -> None:
        """This run and `other` share a card from now; `joined_unknown`: the job placed
        now had no history; `there_unknown`: the job already there had no known demand;
        `joined_by_owner`: the job placed now was expected from its owner's runs."""
        for me, them in ((self, other), (other, self)):
            me.shared = True
            me.beside_busy = me.beside_busy or them.busy
        if self.busy and other.busy:
            how = (
                "unknown joined"
                if joined_unknown
                else "unknown there"
                if there_unknown
                else "owner's runs joined"
                if joined_by_owner
                else "both known"
            )
            self.busy_pairs.add(how)
            other.busy_pairs.add(how)

    def kind(self) -> str:
        if not self.shared:
            return "alone"
        if not self.busy:
            return "light + busy" if self.beside_busy else "light + light"
        if not self.beside_busy:
            return "busy + light"
        for how in ("unknown joined", "unknown there", "owner's runs joined", "both known"):
            if how in self.busy_pairs:
                return f"busy + busy: {how}"
        return "busy + busy: both known"


def lines(jobs: Iterable[tuple[Exposure, float]]) -> list[str]:
    """The breakdown's table rows: (exposure of a job's last run, its slowdown)."""
    rows = list(jobs)
    n = len(rows)
    excess = sum(s - 1 for _, s in rows) or 1.0
    groups: dict[str, list[float]] = {k: [] for k in ORDER}
    for exposure, slowdown in rows:
        groups[exposure.kind()].append(slowdown)
    multi = [s for e, s in rows if e.gpus > 1]
    retried = [s for e, s in rows if e.retried]
    out = [f"    {'last run':<34}{'jobs':>6}{'mean slowdown':>15}{'adds to mean':>14}{'share':>8}"]

    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"    {name:<34}{0:>6}{'-':>15}{'-':>14}{'-':>8}"
        add = sum(s - 1 for s in values)
        return (
            f"    {name:<34}{len(values):>6}{statistics.fmean(values):>15.3f}"
            f"{add / n:>14.3f}{add / excess:>8.0%}"
        )

    out += [row(name, groups[name]) for name in ORDER]
    out.append(row("(of all: multi-GPU)", multi))
    out.append(row("(of all: OOM-retried)", retried))
    return out
