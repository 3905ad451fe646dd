"""What the job commands print and exit with (issue 29's wording and exit codes), and what
a job is told in its environment: the real daemon on simulated GPUs (one for the module),
the real CLI."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from gpusched.cli.show_view import labelled, usage_rows
from gpusched.core.models import Job, JobState
from tests.daemon_harness import RunningDaemon


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon (conftest.py `shared_daemon`): each test reads only its own jobs
    (the next test starts with none running or waiting)."""
    return shared_daemon


PRINT_ENV = (
    "import os, sys; print(os.environ.get('GPUSCHED_ARRAY_ID'),"
    " os.environ.get('GPUSCHED_ARRAY_INDEX'), os.environ['CUDA_VISIBLE_DEVICES'], sys.argv[1:])"
)


def _array_id(stderr: str) -> str:
    """The N of "array aN: 2 jobs", which submit --sweep says on stderr."""
    found = re.search(r"array a(\d+):", stderr)
    assert found is not None, stderr
    return found.group(1)


def test_wait_prints_one_end_line_per_job_also_cancelled_and_for_an_array(
    daemon: RunningDaemon,
) -> None:
    held = daemon.submit("--hold", "--mem", "1G", "--", "true")
    assert daemon.cli("cancel", str(held)).returncode == 0
    cancelled = daemon.cli("wait", str(held))
    assert cancelled.returncode == 1
    assert cancelled.stdout.splitlines() == [f"job {held}: cancelled"]
    failing = daemon.submit("--mem", "1G", "--", sys.executable, "-c", "raise SystemExit(7)")
    result = daemon.cli("wait", str(failing))
    assert result.returncode == 7
    assert result.stdout.splitlines() == [f"job {failing}: failed exit 7"]
    swept = daemon.cli("submit", "--mem", "1G", "--sweep", "x=1,2", "--", "echo", "{x}")
    ids = swept.stdout.split()
    array = "a" + _array_id(swept.stderr)
    both = daemon.cli("wait", array)
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == [f"job {i}: done exit 0" for i in ids]


def test_logs_follow_exits_with_the_jobs_exit_code(daemon: RunningDaemon) -> None:
    job_id = daemon.submit(
        "--mem", "1G", "--", sys.executable, "-c", "print('bye'); raise SystemExit(7)"
    )
    followed = daemon.cli("logs", "-f", str(job_id))
    assert followed.returncode == 7
    assert followed.stdout == "bye\n"
    assert daemon.cli("logs", str(job_id)).returncode == 0  # no -f: the log was printed


def test_cancel_and_hold_say_what_happened_once(daemon: RunningDaemon) -> None:
    queued = daemon.submit("--hold", "--mem", "1G", "--", "true")
    held = daemon.cli("hold", str(queued))
    assert held.stdout.strip() == f"job {queued}: held"
    released = daemon.cli("release", str(queued), "--json")  # still a JSON list
    assert json.loads(released.stdout)[0]["id"] == queued
    other = daemon.submit("--hold", "--mem", "1G", "--", "true")
    cancelled = daemon.cli("cancel", str(other))
    assert cancelled.stdout.strip() == f"job {other}: cancelled"
    running = daemon.submit("--mem", "1G", "--", "sleep", "60")
    daemon.wait_state(running, {"running"})
    stopping = daemon.cli("cancel", str(running))
    assert stopping.stdout.startswith(f"job {running}: stopping")
    assert "(running)" not in stopping.stdout


def test_show_keeps_a_space_after_long_labels_and_no_retry_left_after_it_was_used() -> None:
    retried = Job(31, "a", 1, ["x"], "/", JobState.FAILED, mem=1, retry_oom=1, retried_as=32)
    labels = dict(usage_rows(retried))
    assert labels["retried as"] == "job 32"
    assert "retried as: job 32" in labelled(usage_rows(retried))
    assert labelled([("exit code", 0), ("id", 31)]) == ["exit code: 0", "id:        31"]
    assert "retry-oom" not in labels  # its one retry is job 32's now
    waiting = Job(33, "a", 1, ["x"], "/", JobState.QUEUED, mem=1, retry_oom=1)
    assert "retry-oom" in dict(usage_rows(waiting))


def test_status_mine_user_and_limit_on_ended_jobs(daemon: RunningDaemon) -> None:
    import os
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    ids = []
    for _ in range(3):  # one after the other: their ends are in the order of their ids
        ids.append(daemon.submit("--mem", "1G", "--", "true"))
        daemon.wait_state(ids[-1], {"done"})
    everyone = daemon.status("--all")
    assert {j["id"] for j in everyone["jobs"]} >= set(ids)
    assert {j["id"] for j in daemon.status("--all", "--mine")["jobs"]} >= set(ids)
    assert daemon.status("--all", "--user", "nobody")["jobs"] == []
    assert {j["id"] for j in daemon.status("--all", "--user", me)["jobs"]} >= set(ids)
    limited = daemon.status("--all", "--limit", "2")
    assert [j["id"] for j in limited["jobs"]] == ids[:0:-1]  # the 2 most recent ends
    text = daemon.cli("status", "--all", "--limit", "1")
    assert text.returncode == 0, text.stderr
    assert f"\n{ids[-1]:>6}  " in text.stdout and f"\n{ids[0]:>6}  " not in text.stdout
    both = daemon.cli("status", "--mine", "--user", me)
    assert both.returncode == 2


def test_status_json_takes_limit_for_waiting_jobs_too(fresh_daemon: RunningDaemon) -> None:
    daemon = fresh_daemon
    held = [daemon.submit("--hold", "--mem", "1G", "--", "true") for _ in range(3)]
    assert [j["id"] for j in daemon.status("--limit", "2")["jobs"]] == held[:2]
    assert [j["id"] for j in daemon.status("--limit", "2", fork=True)["jobs"]] == held[:2]
    assert [j["id"] for j in daemon.status("--limit", "0")["jobs"]] == held
    assert [j["id"] for j in daemon.status()["jobs"]] == held


def test_hold_and_release_take_an_array(daemon: RunningDaemon) -> None:
    blocker = daemon.submit("--hold", "--mem", "1G", "--", "true")
    swept = daemon.cli(
        "submit", "--mem", "1G", "--after", str(blocker), "--sweep", "x=1,2", "--", "echo", "{x}"
    )
    assert swept.returncode == 0, swept.stderr
    array, ids = _array_id(swept.stderr), [int(i) for i in swept.stdout.split()]
    held = daemon.cli("hold", f"a{array}")
    assert (held.returncode, held.stdout.splitlines()) == (0, [f"job {i}: held" for i in ids])
    released = daemon.cli("release", f"a{array}")
    assert released.returncode == 0, released.stderr
    assert released.stdout.splitlines() == [f"job {i}: released (queued)" for i in ids]
    again = daemon.cli("release", f"a{array}")
    assert (again.returncode, again.stderr) == (1, f"gpusched: a{array}: no held job to release\n")
    daemon.cli("cancel", str(blocker), *map(str, ids))


def test_a_sweeps_jobs_know_their_array_and_gpus_are_listed_in_order(
    daemon_factory: object, tmp_path: Path
) -> None:
    daemon = daemon_factory(simulate="3x24G").start()  # type: ignore[operator]
    swept = daemon.cli("submit", "--mem", "1G", "--sweep", "x=1,2", "--", sys.executable, "-c",
                       PRINT_ENV, "{x}")  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    array = _array_id(swept.stderr)
    ids = [int(i) for i in swept.stdout.split()]
    for job_id in ids:
        daemon.wait_state(job_id, {"done"})
    seen = sorted(daemon.log(job_id).split()[:2] for job_id in ids)
    assert seen == [[array, "0"], [array, "1"]]
    plain = daemon.submit("--mem", "1G", "--", sys.executable, "-c", PRINT_ENV)
    daemon.wait_state(plain, {"done"})
    assert daemon.log(plain).split()[:2] == ["None", "None"]
    many = daemon.submit("--mem", "1G", "--gpus", "3", "--", sys.executable, "-c", PRINT_ENV)
    daemon.wait_state(many, {"done"})
    assert daemon.log(many).split()[2] == "0,1,2"


def test_visible_devices_are_in_ascending_order_whatever_order_they_were_chosen_in() -> None:
    from gpusched.processes.environment import gpu_environment

    by_index = gpu_environment(5, [2, 0], ["GPU-c", "GPU-a"], "index")
    assert by_index["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert by_index["GPUSCHED_GPU_UUIDS"] == "GPU-a,GPU-c"  # the same order as the indices
    by_uuid = gpu_environment(5, [2, 0], ["GPU-c", "GPU-a"], "uuid")
    assert by_uuid["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-c"


def test_mem_auto_with_a_sweep_is_refused_saying_why(daemon: RunningDaemon) -> None:
    before = daemon.status("--all", "--limit", "0")["jobs"]
    result = daemon.cli("submit", "--mem", "auto", "--sweep", "x=1,2", "--", "echo", "{x}")
    assert result.returncode == 2
    assert "--mem auto learns from earlier runs of the same command" in result.stderr
    assert daemon.status("--all", "--limit", "0")["jobs"] == before  # nothing queued
