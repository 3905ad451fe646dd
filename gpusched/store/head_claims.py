"""`store.head_claims` (`HeadClaims`): the head's claim between passes (the `head_claims`
table): the cards kept for the
blocked first job of the queue, so the next pass, and the next daemon after a restart,
keeps them instead of choosing again (docs/operations.md, "How a card is chosen").

One row at most (one head per scheduler); written only when the claim changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select

from gpusched.store.database import Database
from gpusched.store.rows import decode_json
from gpusched.store.schema import head_claims

# Built once (read at every pass, written at most once a pass): their cache keys are
# hashed once (store.by_id).
_CURRENT = select(head_claims.c.job_id, head_claims.c.gpu_uuids, head_claims.c.mem)
_FORGET = delete(head_claims)
_KEEP = head_claims.insert()


@dataclass(frozen=True)
class StoredClaim:
    job_id: int
    gpu_uuids: tuple[str, ...]
    mem: int | None


class HeadClaims:
    """`store.head_claims`: the one stored claim, read and replaced."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def current(self) -> StoredClaim | None:
        """The claim the last pass stored, if any."""
        with self.db.read() as conn:
            row = conn.execute(_CURRENT).first()
        if row is None:
            return None
        uuids = row.gpu_uuids if isinstance(row.gpu_uuids, list) else decode_json(row.gpu_uuids)
        return StoredClaim(row.job_id, tuple(uuids), row.mem)

    def keep(self, claim: StoredClaim | None) -> None:
        """Replace the stored claim (None: no job is kept cards for)."""
        # Not fsynced: a claim lost to a power cut is chosen again by the next pass.
        with self.db.write(durable=False) as conn:
            conn.execute(_FORGET)
            if claim is not None:
                values = {"job_id": claim.job_id, "gpu_uuids": list(claim.gpu_uuids)}
                conn.execute(_KEEP, {**values, "mem": claim.mem})
