"""Several daemons sharing one queue (docs/cluster.md): real daemons on one machine, each
with simulated GPUs, its own socket, state and log directories and its own node name,
sharing one database (an SQLite file: the conditions that keep a placement, a start
and an end single are the same SQL on PostgreSQL)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon

NODE_TIMEOUT_S = 4


def cluster_config(shared: Path, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "database": f"sqlite:///{shared}",
        "node": node,
        "node_timeout": f"{NODE_TIMEOUT_S}s",
        "poll_interval": "0.5s",
        **extra,
    }


@pytest.fixture
def shared_db(tmp_path: Path) -> Path:
    return tmp_path / "shared" / "queue.db"


@pytest.fixture
def node(daemon_factory: Any, shared_db: Path) -> Callable[..., RunningDaemon]:
    """node("a") -> a started daemon named a on the shared database."""

    def make(name: str, start: bool = True, **extra: Any) -> RunningDaemon:
        daemon = daemon_factory(name, config=cluster_config(shared_db, name, **extra))
        return daemon.start() if start else daemon

    return make


def sleeper(seconds: float = 600) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def test_jobs_run_on_both_nodes_and_status_shows_every_node(
    node: Callable[..., RunningDaemon],
) -> None:
    a, b = node("a"), node("b")
    ids = [a.submit("--", *sleeper()) for _ in range(4)]  # whole GPUs: 2 per node
    for job_id in ids:
        a.wait_state(job_id, {"running"})
    where = sorted(a.show(i)["node"] for i in ids)
    assert where == ["a", "a", "b", "b"]
    status = b.status()
    assert [(n["name"], n["state"]) for n in status["nodes"]] == [("a", "up"), ("b", "up")]
    assert {g["node"] for g in status["gpus"]} == {"a", "b"}
    assert all(len(n["gpus"]) == 2 for n in status["nodes"])
    # A cancel from the other node reaches the job within two seconds.
    on_b = next(i for i in ids if a.show(i)["node"] == "b")
    a.cli("cancel", str(on_b))
    a.wait_state(on_b, {"cancelled"}, timeout=3)


def test_a_second_daemon_with_a_taken_name_refuses_to_start(
    node: Callable[..., RunningDaemon], daemon_factory: Any, shared_db: Path
) -> None:
    node("a")
    twin = daemon_factory("twin", config=cluster_config(shared_db, "a"))
    with pytest.raises(RuntimeError, match="node a is already live on this database"):
        twin.start()
    lines = [line for line in twin.stderr().splitlines() if "already live" in line]
    assert len(lines) == 1
