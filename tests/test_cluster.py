"""Several daemons sharing one queue (docs/cluster.md): real daemons on one machine, each
with simulated GPUs, its own socket, state and log directories and its own node name,
sharing one database (an SQLite file, or PostgreSQL: the conditions that keep a
placement, a start and an end single are the same SQL). Only what needs real processes
is here; declaring a node down, fencing, coming back, re-election and takeover are
decided one pass at a time, with a fixed clock, in tests/test_cluster_tick.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.store import NewJob, NodePlacement, Store
from tests.cluster_harness import NODE_TIMEOUT_S, cluster_config
from tests.daemon_harness import RunningDaemon, eventually
from tests.http_helpers import free_port, scrape


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
    node: Callable[..., RunningDaemon], daemon_factory: Any, shared_db: str
) -> None:
    node("a")
    twin = daemon_factory("twin", config=cluster_config(shared_db, "a"))
    with pytest.raises(RuntimeError, match="node a is already live on this database"):
        twin.start()
    lines = [line for line in twin.stderr().splitlines() if "already live" in line]
    assert len(lines) == 1


def test_a_stale_schedulers_placements_are_refused(shared_db: str) -> None:
    """The condition itself, on the shared database: a scheduler whose lease ran out and
    was taken over writes nothing, however late its write arrives."""
    old, new = Store(shared_db), Store(shared_db)
    try:
        assert old.nodes.claim_node("n", "h:1", 30, None) == 1
        job = old.jobs.add(_new_job(), "2026-01-01T00:00:00+00:00")
        epoch = old.nodes.take_scheduler("old", None, timeout_s=0.001)
        assert epoch == 1
        time.sleep(0.05)  # its lease runs out, by the database's clock
        taken = new.nodes.take_scheduler("new", new.nodes.scheduler_lease(), timeout_s=30)
        assert taken == 2
        placement = NodePlacement(job.id, "n", ("GPU-0",), (0,))
        assert old.placements.place([placement], "old", epoch) == []
        assert old.jobs.get(job.id).node is None
        assert new.placements.place([placement], "new", taken) == [job.id]
        assert new.jobs.get(job.id).node == "n"
    finally:
        old.close()
        new.close()


def _new_job() -> NewJob:
    return NewJob(
        user="nobody",
        uid=65534,
        gid=65534,
        command=["true"],
        cwd="/",
        env={},
        umask=0o022,
        mem=2**30,
    )


def test_drain_node_and_submit_node_from_any_server(
    node: Callable[..., RunningDaemon],
) -> None:
    a = node("a")
    eventually(lambda: "schedules the cluster" in a.stderr(), 10, describe=a.stderr)
    b = node("b")
    drained = a.cli("drain", "--node", "b", "new", "fans")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.startswith("node b: draining since")
    job_id = b.submit("--node", "b", "--", *sleeper())
    # b does not schedule: the reason it shows is the scheduler's, read from the database.
    assert "node b drained" in b.wait_reason(job_id, "drained")["waiting_reason"]
    assert {n["name"]: n["state"] for n in b.status()["nodes"]} == {"a": "up", "b": "drained"}
    assert a.cli("undrain", "--node", "b").returncode == 0
    assert a.wait_state(job_id, {"running"})["node"] == "b"
    # `drain` alone drains the server it runs on.
    assert b.cli("drain").returncode == 0
    assert {n["name"]: n["state"] for n in a.status()["nodes"]}["b"] == "drained"
    other = a.submit("--node", "b", "--", *sleeper())
    a.wait_reason(other, "node b drained")
    refused = a.cli("submit", "--node", "z", "--", *sleeper())
    assert refused.returncode != 0
    assert "--node z: no such node up in this cluster (nodes: a, b)" in refused.stderr


def test_logs_of_a_job_on_another_node(node: Callable[..., RunningDaemon], tmp_path: Path) -> None:
    shared_logs = str(tmp_path / "shared-logs")
    a = node("a", log_dir=shared_logs)
    eventually(lambda: "schedules the cluster" in a.stderr(), 10, describe=a.stderr)
    node("b", log_dir=shared_logs)
    c = node("c")  # its own log_dir: it cannot see the others' logs
    say = [sys.executable, "-c", "print('hello from b')"]
    job_id = a.submit("--node", "b", "--", *say)
    assert a.wait_state(job_id, {"done"})["node"] == "b"
    assert a.log(job_id) == "hello from b\n"  # log_dir shared: read here
    shown = c.cli("logs", str(job_id))
    assert shown.returncode != 0
    path = a.show(job_id)["log_path"]
    assert f"job {job_id} ran on node b: its log is {path} there" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1


def test_each_daemon_exports_its_gpus_and_every_node_s_state(
    node: Callable[..., RunningDaemon],
) -> None:
    ports = [free_port(), free_port()]
    a = node("a", metrics=f"127.0.0.1:{ports[0]}")
    node("b", metrics=f"127.0.0.1:{ports[1]}")
    assert a.cli("drain", "--node", "b").returncode == 0
    for port, name in zip(ports, ("a", "b"), strict=True):
        metrics = scrape(port)
        up = {s.labels["node"]: s.value for s in metrics["gpusched_node_up"].samples}
        assert up == {"a": 1.0, "b": 0.0}
        gpus = metrics["gpusched_gpu_memory_total_bytes"].samples
        assert [(s.labels["node"], s.labels["gpu"]) for s in gpus] == [(name, "0"), (name, "1")]


def test_a_cancel_reaches_another_node_within_two_seconds_whatever_its_poll(
    node: Callable[..., RunningDaemon],
) -> None:
    a = node("a", poll_interval="10s", node_timeout="40s")
    b = node("b", poll_interval="10s", node_timeout="40s")
    job_id = a.submit("--node", "b", "--", *sleeper())
    b.wait_state(job_id, {"running"}, timeout=30)
    eventually(lambda: b.show(job_id)["pid"], 10)
    began = time.monotonic()
    assert a.cli("cancel", str(job_id)).returncode == 0
    a.wait_state(job_id, {"cancelled"}, timeout=5)
    assert time.monotonic() - began < 2.5  # the CLI's own start-up included


def test_wait_on_another_server_sees_the_end_within_a_second_or_two(
    node: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    a = node("a")
    b = node("b")
    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    job_id = b.submit("--node", "b", "--", sys.executable, "-c", code)
    b.wait_state(job_id, {"running"})
    waiting = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "wait", str(job_id)], env=a.env
    )  # on a, which neither runs nor records the job
    try:
        time.sleep(1)
        go.touch()
        began = time.monotonic()
        assert waiting.wait(timeout=10) == 0
        assert time.monotonic() - began < 5
    finally:
        waiting.kill()
        waiting.wait()


def test_a_daemon_back_after_being_declared_down_takes_back_the_requeued_and_watches_the_lost(
    node: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    a = node("a")
    eventually(lambda: "schedules the cluster" in a.stderr(), 10, describe=a.stderr)
    b = node("b")
    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    code += "raise SystemExit(3)"
    lost = a.submit("--node", "b", "--", sys.executable, "-c", code)
    again = a.submit("--node", "b", "--requeue", "--", *sleeper())
    old_pid = b.supervisor_pid(again)
    b.supervisor_pid(lost)
    assert b.stop() == 0  # a clean stop: the jobs run on, the node goes quiet
    assert a.wait_state(lost, {"lost"}, timeout=NODE_TIMEOUT_S + 10)["reason"] == "node_lost"
    a.wait_reason(again, "none of its nodes (b) is up", timeout=10)
    assert psutil.pid_exists(old_pid)
    b.start()
    # Queued again, not started elsewhere, its run still going: taken back, not run twice.
    assert a.wait_state(again, {"running"}, timeout=15)["node"] == "b"
    assert a.show(again)["pid"] == old_pid
    assert psutil.pid_exists(old_pid)
    assert a.show(again)["attempts"] == []  # its one run never ended
    go.touch()
    ended = a.wait_state(lost, {"failed"}, timeout=15)  # its real end, recorded by b
    assert (ended["reason"], ended["exit_code"]) == ("exit", 3)


def test_an_interactive_job_runs_on_the_server_it_was_started_on(
    node: Callable[..., RunningDaemon],
) -> None:
    a = node("a")
    eventually(lambda: "schedules the cluster" in a.stderr(), 10, describe=a.stderr)
    b = node("b")
    say = "import os; print('gpu', os.environ['CUDA_VISIBLE_DEVICES'])"
    ran = subprocess.run(
        [sys.executable, "-m", "gpusched", "run", "--mem", "1G", "--", sys.executable, "-c", say],
        env=b.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "gpu " in ran.stdout
    (job,) = [j for j in a.client().history() if j.interactive]
    assert (job.node, job.state) == ("b", "done")  # placed by a, on b: its client's server


def test_cancel_all_takes_the_callers_jobs_by_name_whatever_their_uid(
    daemon_factory: Any, tmp_path: Path
) -> None:
    """In a cluster a job is its user name's: one queued from a server where that name has
    another uid is still the caller's to cancel with `cancel --all`."""
    from sqlalchemy import update

    from gpusched.store import jobs

    shared = f"sqlite:///{tmp_path / 'shared' / 'queue.db'}"
    a = daemon_factory("a", config=cluster_config(shared, "a")).start()
    here = a.submit("--hold", "--", *sleeper())
    elsewhere = a.submit("--hold", "--", *sleeper())
    store = Store(shared)
    try:
        with store.database.engine.begin() as conn:  # as if queued where root's uid were 4242
            conn.execute(update(jobs).where(jobs.c.id == elsewhere).values(uid=4242))
    finally:
        store.close()
    done = a.cli("cancel", "--all")
    assert done.returncode == 0, done.stderr
    assert {a.show(i)["state"] for i in (here, elsewhere)} == {"cancelled"}
