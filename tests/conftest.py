"""Shared pytest fixtures.

The fake NVML driver's fixtures live in tests/fakenvml/fixtures.py (see its docstring);
they are imported here so every test module can use them by name.
"""

# -- a real daemon on simulated GPUs, in a temporary directory ---------------------------
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gpusched.store import Store
from tests.cluster_harness import node, shared_db  # noqa: F401
from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import (  # noqa: F401
    fake_nvml,
    fake_nvml_builds,
    fake_nvml_inproc,
    fake_nvml_no_v2,
    fake_nvml_old,
)
from tests.faultcluster import cluster  # noqa: F401
from tests.postgres import TEMPLATE, PostgresServer, private_server

# A suite started in the background (`nohup python -m pytest &`) inherits SIGINT ignored,
# and so would every command it starts: the Ctrl-C tests would then test nothing a
# person's shell does (a foreground command has SIGINT's default). A handler of our own
# is reset to that default in each command at its exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The whole suite runs in this many workers (pyproject's addopts: `-n auto`, one file per
# worker): a daemon-tier test is mostly waiting for processes, so three overlap their
# waits on two cores. A run of a few files stays in this process, where starting the
# workers would cost more than they overlap.
SUITE_WORKERS = 3
FILES_WORTH_WORKERS = 12


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: SUITE_WORKERS for a run of many test files, none for a few."""
    files = 0
    for arg in config.args:
        path = Path(arg.split("::")[0])
        files += len(list(path.rglob("test_*.py"))) if path.is_dir() else 1
    return SUITE_WORKERS if files >= FILES_WORTH_WORKERS else 0


@pytest.fixture
def spawn() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start `sleep` processes that are killed and reaped after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "60"]))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where a test's own SQLite queue lives (a directory the Store must create)."""
    return tmp_path / "state" / "gpusched.db"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server for the session (tests/postgres.py), always stopped."""
    with private_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A new database at the store's schema on the private server, dropped after the test."""
    name = postgres_server.create_database(template=TEMPLATE)
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, db_path: Path) -> str:
    """The store's contract holds on both: a test taking this runs once on each."""
    if request.param == "sqlite":
        return f"sqlite:///{db_path}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A real Store on SQLite (a file) or PostgreSQL (a private server), closed after."""
    s = Store(database_url)
    yield s
    s.close()


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Any]:
    """Make (and always stop) daemons: daemon_factory(simulate="2x24G", config={...})."""
    started: list[RunningDaemon] = []

    def make(name: str = "d", **kwargs: Any) -> RunningDaemon:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        daemon = RunningDaemon(root, **kwargs)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()
        daemon.kill_jobs()


@pytest.fixture
def daemon(daemon_factory: Any) -> RunningDaemon:
    """A started daemon with two simulated 24G GPUs."""
    return daemon_factory().start()


@pytest.fixture
def fresh_daemon(daemon_factory: Any) -> RunningDaemon:
    """`daemon`'s own started daemon, by a name a module that made `daemon` its shared
    one keeps for the tests that need one to themselves."""
    return daemon_factory().start()


@pytest.fixture(scope="module")
def module_daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningDaemon]:
    """One daemon for a whole module (RunningDaemon's keywords: the module's
    SHARED_DAEMON dict, else two simulated 24G GPUs); always stopped. Use it through
    `shared_daemon`, which cleans up after each test."""
    root = tmp_path_factory.mktemp("module-daemon")
    daemon = RunningDaemon(root, **getattr(request.module, "SHARED_DAEMON", {}))
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        daemon.kill_jobs()


@pytest.fixture
def shared_daemon(module_daemon: RunningDaemon) -> Iterator[RunningDaemon]:
    """The module's daemon, for a test that touches only its own jobs and asserts nothing
    another test's jobs would change (fair share, head claims, budgets, whole-queue
    listings, history). A module opts in by defining its `daemon` fixture as this one;
    its tests that need a daemon to themselves take `fresh_daemon` (or daemon_factory).

    Each test starts with no job running or waiting, and the daemon not drained: after
    it, whatever it left is cancelled and waited for (its GPUs free), and a test that
    drained the daemon, or killed it, fails here.
    """
    daemon = module_daemon
    assert daemon.process is not None and daemon.process.poll() is None, daemon.stderr()
    yield daemon
    assert daemon.process is not None and daemon.process.poll() is None, (
        f"the module's daemon died during the test: {daemon.stderr()}"
    )
    client = daemon.client()
    client.cancel_mine()  # root's: every job, since only the test process submits here
    eventually(lambda: not daemon.active_jobs(), 30, describe=daemon.active_jobs)
    assert daemon.status()["drain"] is None, "a test left the module's daemon drained"


# CI runs the same examples every time (a red CI must be reproducible, and a slow shared
# machine must not fail a property on a deadline); local runs keep exploring new ones.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
