"""Fixtures for several daemons sharing one queue (tests/test_cluster*.py): the shared
database (an SQLite file, or the private PostgreSQL's) and daemons named after nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon

NODE_TIMEOUT_S = 4


def cluster_config(shared: str, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "database": shared,
        "node": node,
        "node_timeout": f"{NODE_TIMEOUT_S}s",
        "poll_interval": "0.5s",
        **extra,
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The one database of the cluster: an SQLite file, or a private PostgreSQL's."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'queue.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def node(daemon_factory: Any, shared_db: str) -> Callable[..., RunningDaemon]:
    """node("a") -> a started daemon named a on the shared database."""

    def make(name: str, start: bool = True, **extra: Any) -> RunningDaemon:
        daemon = daemon_factory(name, config=cluster_config(shared_db, name, **extra))
        return daemon.start().wait_gpus_reported(name) if start else daemon

    return make
