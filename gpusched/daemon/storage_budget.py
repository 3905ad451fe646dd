"""Each user's budget of bytes stored by their submits (retention.user_bytes_per_minute,
retention.user_bytes_per_day).

`max_queued` bounds what waits, not what is stored: submitting then cancelling jobs
with a new 240 KB environment each time stored 578 MB a minute, every cancelled job
keeping its environment. The budget counts what a submit makes the daemon keep: its
environment (once per distinct environment a day, as the store keeps one copy of each)
and each job's texts (command, name, `--notify`, `--cwd`, `--output`:
handlers.jobs.stored_bytes); past either window's budget the submit is refused with one
line. In memory only: a restart forgets the counts (the retention pass bounds the rest).
Root is not counted.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping

from gpusched.config.retention import RetentionSettings
from gpusched.core.errors import ConflictError
from gpusched.core.units import format_size
from gpusched.daemon.bounds import env_bytes

MINUTE_S = 60.0
DAY_S = 86400.0
BUCKET_S = 10  # the windows slide by this much
_MAX_DIGESTS = 4096  # environments remembered per user (the oldest forgotten first)


def env_digest(env: Mapping[str, str]) -> str:
    text = json.dumps(dict(env), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class _Account:
    def __init__(self) -> None:
        self.buckets: deque[tuple[int, int]] = deque()  # (now // BUCKET_S, bytes), a day's
        self.day_total = 0
        self.envs: OrderedDict[str, float] = OrderedDict()  # digest -> when charged

    def forget_before(self, bucket: int) -> None:
        while self.buckets and self.buckets[0][0] < bucket:
            self.day_total -= self.buckets.popleft()[1]

    def stored_since(self, bucket: int) -> int:
        total = 0
        for when, n in reversed(self.buckets):
            if when < bucket:
                break
            total += n
        return total

    def add(self, bucket: int, n: int) -> None:
        if self.buckets and self.buckets[-1][0] == bucket:
            self.buckets[-1] = (bucket, self.buckets[-1][1] + n)
        else:
            self.buckets.append((bucket, n))
        self.day_total += n


class StorageBudget:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}

    def charge(
        self,
        user: str,
        env: Mapping[str, str],
        command_bytes: int,
        settings: RetentionSettings,
        now: float,
    ) -> None:
        """Count a submit's bytes against `user`, or raise ConflictError (one line)."""
        per_minute, per_day = settings.user_bytes_per_minute, settings.user_bytes_per_day
        if per_minute is None and per_day is None:
            return
        digest = env_digest(env)
        bucket = int(now // BUCKET_S)
        with self._lock:
            account = self._accounts.setdefault(user, _Account())
            account.forget_before(bucket - int(DAY_S // BUCKET_S) + 1)
            seen = account.envs.get(digest)
            new_env = seen is None or seen < now - DAY_S
            adding = command_bytes + (env_bytes(env) if new_env else 0)
            windows = (
                (
                    per_minute,
                    account.stored_since(bucket - int(MINUTE_S // BUCKET_S) + 1),
                    "minute",
                ),
                (per_day, account.day_total, "day"),
            )
            for limit, stored, window in windows:
                if limit is not None and stored + adding > limit:
                    key = f"retention.user_bytes_per_{window}"
                    raise ConflictError(
                        f"storage budget: {user}'s submits stored {format_size(stored)} in the"
                        f" last {window} and this one adds {format_size(adding)}, over"
                        f" {format_size(limit)} ({key}): wait, or reuse one environment"
                    )
            account.add(bucket, adding)
            if new_env:
                account.envs[digest] = now
                account.envs.move_to_end(digest)
                while len(account.envs) > _MAX_DIGESTS:
                    account.envs.popitem(last=False)
