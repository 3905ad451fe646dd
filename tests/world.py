"""The tick test harness: a `Scheduler` over a real Store (SQLite in a temp dir) and the
real policy, with the launcher, the GPUs and the clock as test doubles of their
interfaces (tests/fakes.py). `make_world` builds one; `World.tick()` runs one
scheduling pass and moves the clock on, spawning no process. `make_cluster` builds one
World per node of a cluster, on one database file and one clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import load_config
from gpusched.core.models import Job, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from gpusched.processes.pidref import is_same_process
from gpusched.scheduling.cluster.clock import ClusterClock
from gpusched.scheduling.cluster.node import ClusterNode, Identity
from gpusched.scheduling.context import Context, EndListener
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import NewJob, Store
from tests.daemon_harness import directory_settings
from tests.fakes import FakeLauncher, FakeProbe, FixedClock, GiB, SkewedClock

EXITED_0 = Outcome(OutcomeKind.EXIT, exit_code=0)


@dataclass
class World:
    scheduler: Scheduler
    launcher: FakeLauncher
    probe: FakeProbe
    clock: FixedClock
    root: Path
    # (job id, hooks due) of every end announced, in order: an end listener of the context.
    heard: list[tuple[int, bool]] = field(default_factory=list)

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
        return self.scheduler.decorate(self.scheduler.store.jobs.get(job_id))

    def state(self, job_id: int) -> JobState:
        return self.job(job_id).state

    def gpus_of(self, job_id: int) -> list[int]:
        return self.job(job_id).gpu_indices

    def tick(self) -> None:
        self.scheduler.tick()
        self.clock.advance(2)

    def finish(self, job_id: int, outcome: Outcome = EXITED_0) -> None:
        self.launcher.finish(job_id, outcome)


def make_world(
    root: Path,
    sizes: list[int],
    *,
    end_listeners: Sequence[EndListener] = (),
    probe: FakeProbe | None = None,
    wake: Callable[[], None] | None = None,
    wake_in: Callable[[float], None] | None = None,
    **config: Any,
) -> World:
    """`end_listeners`: told of each end before the World records it (`heard`); `probe`:
    GPUs of the test's own making instead of `sizes`; `wake`: what a pass's wake-up calls;
    `wake_in`: what asking for a pass soon calls."""
    holder = ConfigHolder(
        load_config(None, {**directory_settings(root, None), "headroom": "0", **config})
    )
    holder.current.state_dir.mkdir(parents=True)  # as the daemon does at start
    launcher = FakeLauncher(holder.current.log_dir)
    probe = probe or FakeProbe(sizes)
    clock = FixedClock()
    store = Store(holder.current.database_url)
    heard: list[tuple[int, bool]] = []
    listeners = [*end_listeners, lambda job_id, hooks: heard.append((job_id, hooks))]
    calls: dict[str, Any] = {"wake": wake, "wake_in": wake_in}  # the context's own if None
    context = Context.build(
        holder,
        store,
        probe,
        launcher,
        clock=clock,
        end_listeners=listeners,
        **{name: call for name, call in calls.items() if call is not None},
    )
    return World(Scheduler(context), launcher, probe, clock, root, heard)


# The users every node of a test cluster knows (name -> uid, gid), unless told otherwise.
ACCOUNTS = {"alice": (1000, 1000), "bob": (1001, 1000), "root": (0, 0)}


def make_cluster(
    root: Path,
    names: list[str],
    sizes: list[int],
    *,
    missing: dict[str, set[str]] | None = None,
    client_alive: dict[str, Callable[[int, str | None], bool]] | None = None,
    skews: dict[str, float] | None = None,
    **config: Any,
) -> list[World]:
    """One World per node, all on one SQLite file and one fixed clock (its wall time is
    also the database's, for the leases): the cluster's roles run one pass at a time.
    `missing`: node -> the users that do not exist there. `client_alive`: node -> how it
    sees interactive clients (a client on another server is no process there). `skews`:
    node -> seconds its own wall clock is off the database's."""
    clock = FixedClock()
    return [
        make_node(
            root,
            name,
            sizes,
            clock,
            pid=pid,
            missing=(missing or {}).get(name, set()),
            client_alive=(client_alive or {}).get(name, is_same_process),
            skew_s=(skews or {}).get(name, 0.0),
            **config,
        )
        for pid, name in enumerate(names, start=4000)
    ]


def make_node(
    root: Path,
    name: str,
    sizes: list[int],
    clock: FixedClock,
    *,
    pid: int,
    missing: set[str] = frozenset(),  # type: ignore[assignment]
    client_alive: Callable[[int, str | None], bool] = is_same_process,
    launcher: FakeLauncher | None = None,
    skew_s: float = 0.0,
    **config: Any,
) -> World:
    """One node of `make_cluster`'s cluster (root/cluster.db). `launcher`: the processes
    of a daemon that ran before (its supervisors and exit records outlive it): a restart
    of that node. Joined; adoption and reconciling at start are the caller's."""
    # `database=URL` among the config: another shared database (a benchmark's PostgreSQL).
    database = str(config.pop("database", f"sqlite:///{root / 'cluster.db'}"))
    here = root / name
    settings = {**directory_settings(here, None), "database": database, "node": name}
    holder = ConfigHolder(load_config(None, {**settings, "headroom": "0", **config}))
    holder.current.state_dir.mkdir(parents=True, exist_ok=True)
    if launcher is None:
        launcher = FakeLauncher(holder.current.log_dir)
    probe = FakeProbe(sizes)
    store = Store(database, lease_clock=clock.epoch_s)
    accounts = {user: ids for user, ids in ACCOUNTS.items() if user not in missing}
    identity = Identity(f"host-{name}", pid, alive=lambda _pid: False, account=accounts.get)
    # As the daemon's: its own wall clock (`skew_s` off), corrected to the database's.
    wall = ClusterClock(SkewedClock(clock, skew_s))
    context = Context.build(holder, store, probe, launcher, clock=wall)
    node = ClusterNode(name, identity, clock, holder)
    scheduler = Scheduler(context, node, client_alive=client_alive)
    scheduler.placer.join()
    return World(scheduler, launcher, probe, clock, here)
