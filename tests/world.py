"""The tick test harness: a `Scheduler` over a real Store (SQLite in a temp dir) and the
real policy, with the launcher, the GPUs and the clock as test doubles of their
interfaces (tests/fakes.py). `make_world` builds one; `World.tick()` runs one
scheduling pass and moves the clock on, spawning no process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.core.config import load_config
from gpusched.core.config_holder import ConfigHolder
from gpusched.core.models import Job, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import NewJob, Store
from tests.daemon_harness import directory_settings
from tests.fakes import FakeLauncher, FakeProbe, FixedClock, GiB

EXITED_0 = Outcome(OutcomeKind.EXIT, exit_code=0)


@dataclass
class World:
    scheduler: Scheduler
    launcher: FakeLauncher
    probe: FakeProbe
    clock: FixedClock
    root: Path

    def submit(self, mem: int | None = 8 * GiB, user: str = "alice", **spec: Any) -> int:
        new = NewJob(
            user=user,
            uid=1000 if user == "alice" else 1001,
            gid=1000,
            command=["train.py"],
            cwd="/",
            env={},
            umask=0o022,
            mem=mem,
            **spec,
        )
        return self.scheduler.submit(new).id

    def job(self, job_id: int) -> Job:
        return self.scheduler.decorate(self.scheduler.store.get(job_id))

    def state(self, job_id: int) -> JobState:
        return self.job(job_id).state

    def gpus_of(self, job_id: int) -> list[int]:
        return self.job(job_id).gpu_indices

    def tick(self) -> None:
        self.scheduler.tick()
        self.clock.advance(2)

    def finish(self, job_id: int, outcome: Outcome = EXITED_0) -> None:
        self.launcher.finish(job_id, outcome)


def make_world(root: Path, sizes: list[int], **config: Any) -> World:
    holder = ConfigHolder(
        load_config(None, {**directory_settings(root, None), "headroom": "0", **config})
    )
    holder.current.state_dir.mkdir(parents=True)  # as the daemon does at start
    launcher = FakeLauncher(holder.current.log_dir)
    probe = FakeProbe(sizes)
    clock = FixedClock()
    store = Store(holder.current.database_url)
    return World(Scheduler(holder, store, probe, launcher, clock), launcher, probe, clock, root)
