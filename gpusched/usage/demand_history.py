"""A waiting job's expected GPU demand from its owner's past runs, for a whole pass. Pure.

`UsageMonitor.expected_demand` looks a job up here: the median (`typical_demand`) of the
latest recorded demands (at most PER_KIND) of the owner's runs of the same sweep, else
of the same --name, else of the same command. A job with none of these (a new project)
takes its owner's latest OWNER_RUNS ended runs instead when they are all busy (at least
BUSY_DEMAND: `owner_prior`), unless marked `--share` (its own kind's runs still count);
mixed, light or fewer: unknown, as for a job nothing is known about. Not when all
light: in a loaded queue light jobs start and end sooner than busy ones (they share
cards; busy ones wait for a quieter card), so an owner's latest ended runs read light
while their new jobs are busy (the packing benchmark: 28 of 28 such priors wrong on one
trace; docs/benchmarks.md, packing), and a job of unknown demand already starts where a
light one would except on full cards.

Interactive jobs (`gpusched run`, a notebook's kernel) are a kind apart: their runs are
looked up only among interactive runs of the same sweep, --name or command, and never
count among the owner's latest ended runs, nor does the owner prior apply to them (a
kernel is not its owner's training jobs).

The records are the store's latest (`store.usage.demand_records`, one query, newest
first), read at most once a HISTORY_TTL_S by the monitor: a pass over 10,000 queued jobs
with 10,000 different commands is then 10,000 dictionary look-ups, not 10,000 queries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.usage.demand import typical_demand

PER_KIND = 5
# A job with no history of its own is expected to demand what its owner's latest this
# many ended runs did, when they were all busy.
OWNER_RUNS = 5
# Busy: a demand of at least this (the policy's rule 3, scheduling.policy.budget.BUSY_DEMAND,
# which this layer may not import).
BUSY_DEMAND = 0.5

# (job id, uid, array id, name, command as stored, demand, whether it ended, whether it was
# interactive), newest first; a record of seven (none interactive) is read as batch
DemandRecord = tuple[Any, ...]


@dataclass(frozen=True)
class OwnerPrior:
    """A job's expected demand from its owner's latest ended runs, all busy."""

    demand: float  # their median
    runs: int  # how many (OWNER_RUNS)

    @property
    def busy(self) -> bool:
        return self.demand >= BUSY_DEMAND


def command_key(command: str | Sequence[str]) -> str:
    """A command as the store's JSON text (a queued job's is read as the text itself)."""
    return command if isinstance(command, str) else json.dumps(list(command))


class DemandHistory:
    def __init__(self, records: Iterable[DemandRecord]) -> None:
        # kind -> (job id, demand), newest first; one more than PER_KIND, so that leaving
        # out the job itself (a running one's own flushed figure) still leaves PER_KIND.
        self._by_kind: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
        # uid -> (job id, demand) of its ended runs, newest first (OWNER_RUNS of them).
        self._by_owner: dict[int, list[tuple[int, float]]] = {}
        for job_id, uid, array_id, name, command, demand, ended, *rest in records:
            interactive = bool(rest and rest[0])
            for kind in _kinds(uid, array_id, name, command_key(command), interactive):
                found = self._by_kind.setdefault(kind, [])
                if len(found) <= PER_KIND:
                    found.append((job_id, float(demand)))
            if ended and not interactive:
                latest = self._by_owner.setdefault(uid, [])
                if len(latest) < OWNER_RUNS:
                    latest.append((job_id, float(demand)))
        # Once per owner and read of the history, not once per waiting job of a long queue.
        self._owner_priors = {
            uid: owner_prior_of([d for _, d in runs]) for uid, runs in self._by_owner.items()
        }
        self._owner_ids = {uid: {j for j, _ in runs} for uid, runs in self._by_owner.items()}

    def add(
        self,
        *,
        job_id: int,
        uid: int,
        array_id: int | None,
        name: str | None,
        command: str | Sequence[str],
        demand: float,
        interactive: bool = False,
    ) -> None:
        """A run that has just ended, as the newest record of its kinds and of its owner's
        runs: the next pass knows it without waiting for the next read (a second run of the
        same script submitted a second after the first ended must be expected as busy as it
        was)."""
        for kind in _kinds(uid, array_id, name, command_key(command), interactive):
            found = [(other, d) for other, d in self._by_kind.get(kind, ()) if other != job_id]
            self._by_kind[kind] = [(job_id, float(demand)), *found][: PER_KIND + 1]
        if interactive:
            return  # not among its owner's latest runs (the owner prior is batch jobs')
        older = [(other, d) for other, d in self._by_owner.get(uid, ()) if other != job_id]
        latest = [(job_id, float(demand)), *older][:OWNER_RUNS]
        self._by_owner[uid] = latest
        self._owner_priors[uid] = owner_prior_of([d for _, d in latest])
        self._owner_ids[uid] = {j for j, _ in latest}

    def __bool__(self) -> bool:
        return bool(self._by_kind)

    def expected(
        self,
        job_id: int,
        uid: int,
        array_id: int | None,
        name: str | None,
        command: str | Sequence[str],
        *,
        interactive: bool = False,
    ) -> float | None:
        """The job's expected demand (0.0-1.0), None when nothing like it ran (among
        interactive runs only, for an interactive job; among batch runs, for a batch one)."""
        if not self._by_kind:
            return None
        for kind in _kinds(uid, array_id, name, command_key(command), interactive):
            found = [d for other, d in self._by_kind.get(kind, ()) if other != job_id]
            if found:
                return typical_demand(found[:PER_KIND])
        return None

    def estimate(
        self,
        job_id: int,
        uid: int,
        array_id: int | None,
        name: str | None,
        command: str | Sequence[str],
        *,
        share: bool = False,
        interactive: bool = False,
    ) -> tuple[float | None, int]:
        """The job's expected demand and, when it is its owner's (`owner_prior`), of how
        many of the owner's latest ended runs (0: its own history, or nothing known).
        `share` (`--share`) or `interactive`: its own kind's runs as measured, never its
        owner's others (its owner said it is light, or it is no batch job)."""
        own = self.expected(job_id, uid, array_id, name, command, interactive=interactive)
        if own is not None:
            return own, 0
        prior = None if share or interactive else self.owner_prior(job_id, uid)
        return (None, 0) if prior is None else (prior.demand, prior.runs)

    def owner_prior(self, job_id: int, uid: int) -> OwnerPrior | None:
        """For a job with no history of its own (`expected` is None): its owner's latest
        OWNER_RUNS ended runs' median when they were all busy; None when they are fewer,
        mixed or light (nothing is known of the job, as before). Only the owner's:
        another user's runs say nothing of this one's new project."""
        ids = self._owner_ids.get(uid)
        if ids is None:
            return None
        if job_id in ids:  # an ended job asked again: its own run is no prior of its own
            return owner_prior_of([d for other, d in self._by_owner[uid] if other != job_id])
        return self._owner_priors[uid]


def owner_prior_of(latest: Sequence[float]) -> OwnerPrior | None:
    """The owner prior of the demands of an owner's ended runs, newest first: the median
    of the latest OWNER_RUNS when they were all busy, else None. (The packing benchmark's
    simulation calls this too, so that it models what the daemon does.)"""
    latest = latest[:OWNER_RUNS]
    if len(latest) < OWNER_RUNS or any(d < BUSY_DEMAND for d in latest):
        return None
    median = typical_demand(latest)
    return None if median is None else OwnerPrior(median, len(latest))


def _kinds(
    uid: int, array_id: int | None, name: str | None, command: str, interactive: bool = False
) -> Iterable[tuple[Any, ...]]:
    """The keys a run is looked up by, most specific first; an interactive run's are its
    own (never a batch run's)."""
    apart = ("interactive",) if interactive else ()
    if array_id is not None:
        yield (*apart, "sweep", uid, array_id)
    if name:
        yield (*apart, "name", uid, name)
    yield (*apart, "command", uid, command)
