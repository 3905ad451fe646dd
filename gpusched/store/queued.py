"""What a scheduling pass reads of each queued job (`Queued`, `QUEUED_SELECT`: those
columns only, not the whole Job), and the memo that gives an unchanged row's `Queued`
back undecoded (`queued_of`). `store.jobs.queued()` (gpusched.store.queries) reads them,
when the queue's change marker (gpusched.store.queue_marks) says it may have changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, select, type_coerce

from gpusched.core.models import JobState
from gpusched.store.rows import decode_json
from gpusched.store.schema import jobs


@dataclass(frozen=True)
class Queued:
    """What a scheduling pass needs of a queued job (store.jobs.queued): a pass reads every
    queued job, so it reads these columns only, not the whole Job."""

    id: int
    user: str
    mem: int | None
    gpus: int
    priority: int
    after: list[int]
    array_id: int | None
    max_concurrent: int | None
    retry_of: int | None
    interactive: int | None  # 1: `gpusched run` / claim() (capped by interactive.max_per_user)
    allowed_nodes: list[str] | None = None  # `submit --node`; None: any node
    after_when: list[str] | None = None  # how each of `after` must end; None: all `ok`
    time_limit_s: float | None = None  # --time (the policy's time backfill)
    submitted_at: str | None = None
    exclusive: int | None = None  # 1: --exclusive
    share: int | None = None  # 1: --share
    top: int | None = None  # `gpusched top`'s rank
    # What its expected GPU demand is looked up by (UsageMonitor.expected_demand): the
    # command stays JSON text here, decoded only where a pass needs it.
    uid: int = 0
    name: str | None = None
    command_json: str = "[]"
    ram: int | None = None  # --ram, bytes (the policy's host rule); None: not given
    cpus: int | None = None  # --cpus; None: not given


QUEUED_SELECT = select(
    *(
        type_coerce(jobs.c[f.name], Text)
        if f.name in ("after", "allowed_nodes", "after_when")
        else type_coerce(jobs.c.command, Text)
        if f.name == "command_json"
        else jobs.c[f.name]
        for f in dataclasses.fields(Queued)
    )
    # A job placed on a node (cluster) waits there for its agent: planned already.
).where(jobs.c.state == str(JobState.QUEUED), jobs.c.node.is_(None))


def queued_of(
    rows: Iterable[Iterable[Any]], known: dict[tuple[Any, ...], Queued]
) -> tuple[list[Queued], dict[tuple[Any, ...], Queued]]:
    """Each row's `Queued`, and the rows' memo for the next read: a row identical to one
    read last time gives the same (frozen) `Queued` again, undecoded. Every pass reads
    every queued job (10,000 in a long queue) and few change between two passes; the
    memo holds only the last read's rows, and nothing is reused unless its row is equal."""
    made: dict[tuple[Any, ...], Queued] = {}
    found = []
    for row in rows:
        key = tuple(row)  # a plain tuple: C's hash and ==, not the Row's Python ones
        try:
            job = known.get(key)
        except TypeError:  # psycopg decodes the JSON columns itself: lists, not text
            key = tuple(tuple(v) if isinstance(v, list) else v for v in key)
            job = known.get(key)
        if job is None:
            i, u, m, g, p, a, ai, mc, ro, it, an, aw, *rest = row
            a, an, aw = decode_json(a), decode_json(an), decode_json(aw)
            job = Queued(i, u, m, g, p, a, ai, mc, ro, it, an, aw, *rest)
        made[key] = job
        found.append(job)
    return found, made
