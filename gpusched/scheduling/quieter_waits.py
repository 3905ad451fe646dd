"""When each waiting job was first held for a quieter card (policy rule 3).

`plan()` is pure and says which jobs it held (`Plan.quieter`); the placer keeps the first
time of each here, in memory, and hands it back as the job's `waited_s`, so its reason
says how long it has waited for one ("for 12 min so far"), counted from the first pass
that held it, not from its submit (a job that waited an hour for memory or for its
`--after` has not waited for a quieter card). A restart, or another daemon elected in a
cluster, forgets it: the count starts again, nothing else depends on it (the bound on the
wait is the card rule 3 keeps for the job, not a time).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


class QuieterWaits:
    def __init__(self) -> None:
        self._since: dict[int, float] = {}  # job id -> when first held (epoch seconds)

    def __bool__(self) -> bool:
        return bool(self._since)

    def waited_s(self, job_id: int, now_s: float) -> float:
        """How long `job_id` has waited for a quieter card (0: never held for one)."""
        since = self._since.get(job_id)
        return 0.0 if since is None else max(0.0, now_s - since)

    def note(self, held: Iterable[int], waiting: Collection[int], now_s: float) -> None:
        """After a pass: `held`, the jobs it held for a quieter card; `waiting`, every job
        still queued (the others started or ended: forgotten)."""
        for job_id in held:
            self._since.setdefault(job_id, now_s)
        for job_id in [j for j in self._since if j not in waiting]:
            del self._since[job_id]
