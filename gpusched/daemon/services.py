"""What a request handler may use: the scheduler, the store, the current config and the
authorisation rules, never the server (its socket, connections and limits).

Built once by the daemon (main.py) and handed to the server, which passes it to
`handlers.dispatch` with each request; a test builds one over a real Store and a
scheduler on fakes and calls the handlers with no socket at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import Config
from gpusched.core.models import Job
from gpusched.daemon import auth
from gpusched.daemon.identity import Caller
from gpusched.daemon.retention import RetentionPass
from gpusched.daemon.storage_budget import StorageBudget
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import Store


@dataclass(frozen=True)
class Services:
    """`settings`: the daemon's one config holder, read at each use so that a SIGHUP
    reload reaches the next request. `owner_uid`: whose daemon this is (0: the system
    service, serving everyone; any other uid: a user's own daemon, serving only them)."""

    scheduler: Scheduler
    # The whole Store: between them the handlers read store.jobs, store.attempts (show,
    # history) and store.usage (estimates); each handler names the part it reads.
    store: Store
    settings: ConfigHolder
    owner_uid: int
    # The daemon's config reload (`admin reload`): what it kept, or its ConfigError.
    reload_config: Callable[[], list[str]] | None = None
    # What each user's submits stored lately (retention.user_bytes_per_minute / _per_day).
    budget: StorageBudget = field(default_factory=StorageBudget)
    # The retention pass, which `admin prune` runs on demand (None: no pruning here).
    retention: RetentionPass | None = None

    @property
    def config(self) -> Config:
        return self.settings.current

    @property
    def single_user(self) -> bool:
        return self.owner_uid != 0

    def owned_job(self, caller: Caller, job_id: int) -> Job:
        return auth.owned_job(self.store.jobs, caller, job_id, self.scheduler.in_cluster)

    def visible(self, caller: Caller, job: Job) -> dict[str, Any]:
        return auth.visible(self.scheduler, self.config, caller, job)
