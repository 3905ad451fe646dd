"""A waiting job's expected GPU demand from its owner's past runs, for a whole pass. Pure.

`UsageMonitor.expected_demand` looks a job up here: the median (`typical_demand`) of the
latest recorded demands (at most PER_KIND) of the owner's runs of the same sweep, else
of the same --name, else of the same command. The records are the store's latest
(`store.usage.demand_records`, one query, newest first), read at most once a HISTORY_TTL_S by
the monitor: a pass over 10,000 queued jobs with 10,000 different commands is then 10,000
dictionary look-ups, not 10,000 queries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from gpusched.usage.demand import typical_demand

PER_KIND = 5

# (job id, uid, array id, name, command as stored, demand), newest first
DemandRecord = tuple[int, int, int | None, str | None, Any, float]


def command_key(command: str | Sequence[str]) -> str:
    """A command as the store's JSON text (a queued job's is read as the text itself)."""
    return command if isinstance(command, str) else json.dumps(list(command))


class DemandHistory:
    def __init__(self, records: Iterable[DemandRecord]) -> None:
        # kind -> (job id, demand), newest first; one more than PER_KIND, so that leaving
        # out the job itself (a running one's own flushed figure) still leaves PER_KIND.
        self._by_kind: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
        for job_id, uid, array_id, name, command, demand in records:
            for kind in _kinds(uid, array_id, name, command_key(command)):
                found = self._by_kind.setdefault(kind, [])
                if len(found) <= PER_KIND:
                    found.append((job_id, float(demand)))

    def add(
        self,
        *,
        job_id: int,
        uid: int,
        array_id: int | None,
        name: str | None,
        command: str | Sequence[str],
        demand: float,
    ) -> None:
        """A run that has just ended, as the newest record of its kinds: the next pass
        knows it without waiting for the next read (a second run of the same script
        submitted a second after the first ended must be expected as busy as it was)."""
        for kind in _kinds(uid, array_id, name, command_key(command)):
            found = [(other, d) for other, d in self._by_kind.get(kind, ()) if other != job_id]
            self._by_kind[kind] = [(job_id, float(demand)), *found][: PER_KIND + 1]

    def __bool__(self) -> bool:
        return bool(self._by_kind)

    def expected(
        self,
        job_id: int,
        uid: int,
        array_id: int | None,
        name: str | None,
        command: str | Sequence[str],
    ) -> float | None:
        """The job's expected demand (0.0-1.0), None when nothing like it ran."""
        if not self._by_kind:
            return None
        for kind in _kinds(uid, array_id, name, command_key(command)):
            found = [d for other, d in self._by_kind.get(kind, ()) if other != job_id]
            if found:
                return typical_demand(found[:PER_KIND])
        return None


def _kinds(
    uid: int, array_id: int | None, name: str | None, command: str
) -> Iterable[tuple[Any, ...]]:
    if array_id is not None:
        yield ("sweep", uid, array_id)
    if name:
        yield ("name", uid, name)
    yield ("command", uid, command)
