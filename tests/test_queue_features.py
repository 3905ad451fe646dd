"""The queue people expect: priorities, requeue, sweeps, fair share, time limits, waiting reasons.

End to end against the real daemon on simulated GPUs: one for the module where a test
touches only its own jobs (priorities and fair share need a queue of their own).
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import psutil
import pytest

from tests.daemon_harness import RunningDaemon
from tests.users import as_user, throwaway_users


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon (conftest.py `shared_daemon`): each test here reads only its own
    jobs and arrays; those that order a queue start their own (_one_gpu)."""
    return shared_daemon


def _one_gpu(daemon_factory: Any, **config: Any) -> RunningDaemon:
    return daemon_factory(simulate="1x24G", config={"poll_interval": "0.5s", **config}).start()


def test_priority_of_a_waiting_job_can_be_raised(daemon_factory: Any) -> None:
    daemon = _one_gpu(daemon_factory)
    blocker = daemon.submit("--", "sleep", "60")
    daemon.wait_state(blocker, {"running"})
    first = daemon.submit("--", "true")
    second = daemon.submit("--", "true")
    result = daemon.cli("priority", str(second), "5")
    assert result.returncode == 0, result.stderr
    assert daemon.show(second)["priority"] == 5
    daemon.cli("cancel", str(blocker))
    jobs = daemon.client().wait([first, second], timeout=20)
    assert jobs[1].started_at is not None and jobs[0].started_at is not None
    assert jobs[1].started_at < jobs[0].started_at
    # Only a waiting job's priority can change.
    again = daemon.cli("priority", str(second), "1")
    assert again.returncode == 1
    assert "only a waiting job" in again.stderr


def test_requeue_submits_an_ended_job_again(daemon: RunningDaemon) -> None:
    original = daemon.submit(
        "--mem",
        "1G",
        "--name",
        "again",
        "--retry-oom",
        "2",
        "--",
        sys.executable,
        "-c",
        "print('run')",
    )
    daemon.wait_state(original, {"done"})
    result = daemon.cli("requeue", str(original))
    assert result.returncode == 0, result.stderr
    copy = int(result.stdout)
    assert copy != original
    job = daemon.wait_state(copy, {"done"})
    first = daemon.show(original)
    assert (job["command"], job["mem"], job["name"], job["cwd"], job["retry_oom"]) == (
        first["command"],
        first["mem"],
        first["name"],
        first["cwd"],
        2,
    )
    assert daemon.log(copy) == "run\n"
    running = daemon.submit("--mem", "1G", "--", "sleep", "30")
    refused = daemon.cli("requeue", str(running))
    assert refused.returncode == 1
    assert "only an ended job" in refused.stderr


def test_sweep_submits_the_cartesian_product_as_one_array(daemon: RunningDaemon) -> None:
    result = daemon.cli(
        "submit",
        "--mem",
        "1G",
        "--sweep",
        "lr=0.1,0.01",
        "--sweep",
        "bs=32,64",
        "--",
        "sh",
        "-c",
        "echo lr={lr} bs={bs}",
    )
    assert result.returncode == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    assert len(ids) == 4
    jobs = [daemon.wait_state(i, {"done"}) for i in ids]
    array_ids = {j["array_id"] for j in jobs}
    assert len(array_ids) == 1 and None not in array_ids
    array = array_ids.pop()
    assert f"array a{array}: 4 jobs" in result.stderr
    outputs = [daemon.log(i).strip() for i in ids]
    assert outputs == ["lr=0.1 bs=32", "lr=0.1 bs=64", "lr=0.01 bs=32", "lr=0.01 bs=64"]
    assert [j["name"] for j in jobs] == [
        "lr=0.1 bs=32",
        "lr=0.1 bs=64",
        "lr=0.01 bs=32",
        "lr=0.01 bs=64",
    ]
    shown = json.loads(daemon.cli("status", "--json", f"a{array}").stdout)
    assert [j["id"] for j in shown["jobs"]] == ids


def test_sweep_max_concurrent_and_cancel_by_array_id(daemon: RunningDaemon) -> None:
    result = daemon.cli(
        "submit",
        "--mem",
        "1G",
        "--sweep",
        "n=1,2,3,4",
        "--max-concurrent",
        "2",
        "--",
        "sleep",
        "{n}0",
    )
    ids = [int(line) for line in result.stdout.split()]
    array = daemon.show(ids[0])["array_id"]
    daemon.wait_state(ids[0], {"running"})
    daemon.wait_state(ids[1], {"running"})
    waiting = daemon.wait_reason(ids[2], "array limit")
    assert (
        waiting["waiting_reason"]
        == f"array limit: 2 of array a{array} running (--max-concurrent 2)"
    )
    cancelled = daemon.cli("cancel", f"a{array}")
    assert cancelled.returncode == 0, cancelled.stderr
    states = {daemon.wait_state(i, {"cancelled"})["state"] for i in ids}
    assert states == {"cancelled"}


def test_sweep_input_errors(daemon: RunningDaemon) -> None:
    missing = daemon.cli("submit", "--sweep", "lr=0.1", "--", "echo", "no placeholder")
    assert missing.returncode == 2
    assert "{lr}" in missing.stderr
    bad = daemon.cli("submit", "--sweep", "lr", "--", "echo", "{lr}")
    assert bad.returncode == 2
    assert "--sweep" in bad.stderr
    lonely = daemon.cli("submit", "--max-concurrent", "2", "--", "true")
    assert lonely.returncode == 2


def test_time_limit_stops_a_job_with_reason_timeout(daemon: RunningDaemon) -> None:
    job_id = daemon.submit("--mem", "1G", "--time", "1s", "--", "sleep", "60")
    job = daemon.wait_state(job_id, {"failed", "done"}, timeout=20)
    assert job["reason"] == "timeout"
    assert "time limit" in job["reason_detail"]
    assert job["pid"] is not None and not _alive_sleep(job["pid"])
    started = daemon.show(job_id)
    assert started["time_limit_s"] == 1.0


def _alive_sleep(supervisor_pid: int) -> bool:
    try:
        return bool(psutil.Process(supervisor_pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return False


def test_fair_share_lets_a_light_user_pass_a_flood(daemon_factory: Any) -> None:
    with throwaway_users(2, extra_group=False) as ((alice, bob), _):
        daemon = _shared_one_gpu()
        try:
            socket_path = daemon.socket_path

            def flood() -> list[int]:
                from gpusched.client import Client

                client = Client(socket_path)
                return [client.submit(["sleep", "1"]).id for _ in range(6)]

            alice_ids = as_user(alice, flood)
            daemon.wait_state(alice_ids[0], {"running"})

            def one() -> int:
                from gpusched.client import Client

                return Client(socket_path).submit(["sleep", "1"]).id

            bob_id = as_user(bob, one)
            jobs = {j.id: j for j in daemon.client().wait([*alice_ids, bob_id], timeout=60)}
            order = sorted(jobs, key=lambda i: jobs[i].started_at or "")
            bob_job = jobs[bob_id]
            assert bob_job.submitted_at is not None and bob_job.started_at is not None
            # Alice had used the GPU, Bob had not: his job is the first to start after he
            # submitted it, ahead of every job of her flood still waiting then.
            passed = [i for i in alice_ids if (jobs[i].started_at or "") > bob_job.submitted_at]
            assert passed, "alice's flood had ended before bob submitted: the test proves nothing"
            assert all((jobs[i].started_at or "") > bob_job.started_at for i in passed), order
            # Alice's own jobs keep their first-come order.
            assert [i for i in order if i != bob_id] == alice_ids
        finally:
            daemon.stop()
            daemon.kill_jobs()
            shutil.rmtree(daemon.root, ignore_errors=True)


def _shared_one_gpu() -> RunningDaemon:
    """A daemon in a directory other users can traverse (pytest's tmp dirs are root-only)."""
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="gpusched-fair-", dir="/tmp"))
    root.chmod(0o755)
    return RunningDaemon(root, simulate="1x24G", config={"poll_interval": "0.5s"}).start()
