"""End to end: the real daemon on simulated GPUs, real jobs, the real CLI where its
words and exit codes are what is tested (tests/daemon_harness.py: the other calls are
in-process).

One daemon serves the module (`daemon`: conftest.py `shared_daemon`): each of these tests
touches only its own jobs. Those whose assertions another test's jobs would change (the
whole status or history, placement on idle cards, a command's busy history, a restart)
take a daemon of their own (`fresh_daemon`, daemon_factory). Placement rules are the
tick tests' (tests/test_tick*.py): here only what needs the real process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.core.errors import UsageError
from tests.daemon_harness import RunningDaemon, eventually

PRINT_GPU = "import os; print('GPU=' + os.environ['CUDA_VISIBLE_DEVICES'])"


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    return shared_daemon


def test_first_job_reports_its_gpu_in_logs_and_status_shows_both_gpus(
    fresh_daemon: RunningDaemon,
) -> None:
    daemon = fresh_daemon
    job_id = daemon.submit("--mem", "10G", "--", sys.executable, "-c", PRINT_GPU)
    job = daemon.wait_state(job_id, {"done"})
    assert job["exit_code"] == 0
    assert job["reason"] == "exit"
    assert daemon.log(job_id).strip() == f"GPU={job['gpu_indices'][0]}"
    status = daemon.status("--all")
    assert [g["index"] for g in status["gpus"]] == [0, 1]
    for gpu in status["gpus"]:
        assert gpu["total"] == 24 * 2**30
        assert {"used", "reserved", "available", "free", "util", "state", "jobs", "uuid"} <= set(
            gpu
        )
    assert [j["id"] for j in status["jobs"]] == [job_id]
    human = daemon.cli("status", "--all")
    assert human.returncode == 0
    assert "AVAILABLE" in human.stdout and "reserved" in human.stdout
    assert f"{job_id} " in human.stdout


def test_job_waits_when_nothing_fits_and_starts_when_room_frees(daemon: RunningDaemon) -> None:
    blockers = [daemon.submit("--mem", "20G", "--", "sleep", "60") for _ in range(2)]
    for job_id in blockers:
        daemon.wait_state(job_id, {"running"})
    waiting = daemon.submit("--mem", "20G", "--", "true")
    daemon.wait_reason(waiting, "needs 20.0G on 1 GPU")
    assert daemon.cli("cancel", str(blockers[1])).returncode == 0
    job = daemon.wait_state(waiting, {"done"}, timeout=15)
    assert job["gpu_indices"] == daemon.show(blockers[1])["gpu_indices"]
    assert daemon.show(blockers[1])["reason"] == "cancelled"


def test_next_job_starts_at_once_when_one_exits_not_at_the_next_poll(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(config={"poll_interval": "60s"}).start()
    first = daemon.submit("--", "sleep", "0.5")  # a whole GPU each
    second = daemon.submit("--", "sleep", "0.5")
    third = daemon.submit("--", "true")
    done = daemon.client().wait([first, second, third], timeout=20)
    assert [j.state for j in done] == ["done", "done", "done"]
    # The third could start only when one of the first two ended; with a 60 s poll,
    # starting within seconds proves the exit woke the scheduler.
    ends = [job.ended_at for job in done[:2]]
    assert ends[0] is not None and ends[1] is not None
    gap = _seconds_between(min(ends), done[2].started_at)
    assert gap < 5, gap


def _seconds_between(a: str, b: str | None) -> float:
    from datetime import datetime

    assert b is not None
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def test_whole_gpu_job_waits_for_a_gpu_without_gpusched_jobs(fresh_daemon: RunningDaemon) -> None:
    daemon = fresh_daemon
    small = [daemon.submit("--mem", "1G", "--", "sleep", "60") for _ in range(2)]
    assert {daemon.wait_state(j, {"running"})["gpu_indices"][0] for j in small} == {0, 1}
    whole = daemon.submit("--", "sleep", "60")
    daemon.wait_reason(whole, "GPU")  # a pass has seen it and left it waiting
    daemon.cli("cancel", str(small[0]))
    job = daemon.wait_state(whole, {"running"})
    assert job["mem"] is None
    gpu = next(g for g in daemon.status()["gpus"] if g["index"] == job["gpu_indices"][0])
    assert gpu["available"] == 0
    # Nothing else may share a whole-GPU job's card, however small or light. (A command
    # with no history, --share: nothing measured says it is busy, so it never waits for a
    # quieter card; it joins job 2 on GPU 1.)
    tiny = daemon.submit("--mem", "256M", "--share", "--", "sleep", "59")
    assert daemon.wait_state(tiny, {"running"})["gpu_indices"] != job["gpu_indices"]


def test_job_runs_with_submitters_env_cwd_and_argv_without_a_shell(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    script = (
        "import json, os, sys; json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(),"
        " 'env': dict(os.environ)}, open('out.json', 'w'))"
    )
    env = {**daemon.env, "MY_SETTING": "42"}
    tricky = ["$HOME", "a b", "'quoted'", ";", "`id`", "*"]
    job_id = daemon.submit(
        "--mem", "1G", "--cwd", str(workdir), "--", sys.executable, "-c", script, *tricky, env=env
    )
    assert daemon.wait_state(job_id, {"done", "failed"})["state"] == "done"
    seen = json.loads((workdir / "out.json").read_text())
    assert seen["argv"] == tricky
    assert seen["cwd"] == str(workdir)
    assert seen["env"]["MY_SETTING"] == "42"
    assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["env"]["GPUSCHED_JOB_ID"] == str(job_id)
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] in {"0", "1"}
    assert seen["env"]["GPUSCHED_GPU_UUIDS"].startswith("GPU-")


def test_a_py_script_runs_with_the_python_on_the_submitters_path(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    fake_python = bindir / "python"
    fake_python.write_text(f'#!/bin/sh\necho from-venv-python\nexec {sys.executable} "$@"\n')
    fake_python.chmod(0o755)
    (tmp_path / "train.py").write_text("print('training')\n")
    env = {**daemon.env, "PATH": f"{bindir}:{os.environ['PATH']}"}
    job_id = daemon.submit("train.py", "--mem", "1G", env=env, cwd=tmp_path)
    job = daemon.wait_state(job_id, {"done", "failed"})
    assert job["command"] == [str(fake_python), "train.py"]
    assert daemon.log(job_id).split() == ["from-venv-python", "training"]


def test_wait_exits_with_the_jobs_exit_code_and_124_on_timeout(daemon: RunningDaemon) -> None:
    failing = daemon.submit("--mem", "1G", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert daemon.cli("wait", str(failing)).returncode == 7
    job = daemon.show(failing)
    assert (job["state"], job["reason"], job["exit_code"]) == ("failed", "exit", 7)
    slow = daemon.submit("--mem", "1G", "--", "sleep", "30")
    result = daemon.cli("wait", "--timeout", "0.5", str(slow))
    assert result.returncode == 124
    assert "timed out" in result.stderr
    ok = daemon.submit("--mem", "1G", "--", "true")
    assert daemon.cli("wait", str(ok)).returncode == 0
    assert daemon.cli("wait", str(ok), str(failing)).returncode == 1


def test_logs_and_follow(daemon: RunningDaemon) -> None:
    script = (
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.3)"
    )
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", script)
    followed = daemon.cli("logs", "-f", str(job_id), timeout=30)
    assert followed.returncode == 0
    assert followed.stdout.splitlines() == ["line 0", "line 1", "line 2"]
    assert daemon.show(job_id)["state"] == "done"
    stderr_job = daemon.submit(
        "--mem", "1G", "--", sys.executable, "-c", "import sys; sys.stderr.write('oops\\n')"
    )
    daemon.wait_state(stderr_job, {"done"})
    assert daemon.log(stderr_job) == "oops\n"


def test_cancel_kills_the_whole_process_tree_even_a_setsid_child(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    pids_file = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "escaped = subprocess.Popen(['setsid', 'sleep', '301'])\n"
        f"open({str(pids_file)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}} {{escaped.pid}}')\n"
        "time.sleep(300)\n"
    )
    job_id = daemon.submit("--mem", "1G", "--", sys.executable, "-c", script)
    daemon.wait_state(job_id, {"running"})
    eventually(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert all(psutil.pid_exists(p) for p in pids)
    result = daemon.cli("cancel", str(job_id))
    assert result.returncode == 0, result.stderr
    job = daemon.wait_state(job_id, {"cancelled"}, timeout=15)
    assert job["reason"] == "cancelled"
    eventually(lambda: not any(_alive(p) for p in pids), describe=lambda: pids)
    again = daemon.cli("cancel", str(job_id))
    assert again.returncode == 1
    assert "already ended" in again.stderr


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cancel_a_queued_job_and_hold_release(daemon: RunningDaemon) -> None:
    held = daemon.submit("--hold", "--mem", "1G", "--", "true")
    assert daemon.show(held)["state"] == "held"
    assert "held" in daemon.show(held)["waiting_reason"]
    assert daemon.cli("release", str(held)).returncode == 0
    assert daemon.wait_state(held, {"done"})["exit_code"] == 0
    queued = daemon.submit("--hold", "--mem", "1G", "--", "true")
    assert daemon.cli("cancel", str(queued)).returncode == 0
    job = daemon.show(queued)
    assert (job["state"], job["reason"], job["started_at"]) == ("cancelled", "cancelled", None)


def test_restart_keeps_the_queue_and_readopts_running_jobs(
    daemon_factory: Any, tmp_path: Path
) -> None:
    daemon = daemon_factory().start()
    marker = tmp_path / "ran"
    # The runner ends only once the test lets it (after the restart), whatever the load:
    # a fixed sleep could end it during a slow restart and nothing would be re-adopted.
    go = tmp_path / "go"
    runner = daemon.submit(
        "--mem",
        "20G",
        "--",
        sys.executable,
        "-c",
        "import os, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)",
    )
    daemon.wait_state(runner, {"running"})
    queued = [daemon.submit("--mem", "20G", "--priority", str(p), "--", "true") for p in (0, 5)]
    queued.append(daemon.submit("--hold", "--mem", "1G", "--", "true"))
    blocker = daemon.submit("--mem", "20G", "--", "sleep", "60")
    daemon.wait_state(blocker, {"running"})
    before = [(j["id"], j["state"], j["priority"]) for j in daemon.status()["jobs"]]
    daemon.stop(signal.SIGKILL)
    restarted = daemon.start()
    after = [(j["id"], j["state"], j["priority"]) for j in restarted.status()["jobs"]]
    assert after == before
    assert not marker.exists()
    go.touch()
    # The job that ran across the restart is re-adopted: its real exit code is recorded, once.
    assert restarted.cli("wait", str(runner), timeout=30).returncode == 3
    assert marker.read_text() == "x"
    assert restarted.show(queued[2])["state"] == "held"


def test_bad_input_gets_one_line_and_the_contract_exit_code(daemon: RunningDaemon) -> None:
    cases = [
        (["submit", "--mem", "8Q", "--", "true"], 2, "--mem 8Q: expected a number and a unit"),
        (["submit", "--mem", "-1", "--", "true"], 2, "--mem -1: expected a number and a unit"),
        (["submit", "--mem", "0", "--", "true"], 2, "more than zero"),
        (["submit", "--gpus", "0", "--", "true"], 2, "--gpus"),
        (["submit", "--gpus", "3", "--mem", "1G", "--", "true"], 2, "only 2 GPU"),
        (["submit", "--mem", "100G", "--", "true"], 2, "largest is GPU 0"),
        (["submit", "--mem", "1G", "--", ""], 2, "no command"),
        (["submit", "--after", "999", "--", "true"], 2, "no job 999"),
        (["show", "999"], 1, "no job 999"),
        (["cancel", "999"], 1, "no job 999"),
        (["wait", "999"], 1, "no job 999"),
        (["logs", "999"], 1, "no job 999"),
        (["cancel", "abc"], 2, "invalid id"),
        (["wait", "a0"], 2, "invalid id"),
        (["cancel", "a999"], 1, "no array a999"),
        (["history", "--state", "running"], 2, "an ended job is one of cancelled, done"),
        (["history", "--since", "yesterday"], 2, "expected a time ago (12h, 2d)"),
        (["cancel"], 2, "give job ids, or --all"),
        (["cancel", "5", "--all"], 2, "give job ids, or --all"),
        (["cancel", "5", "--waiting"], 2, "--waiting goes with --all"),
    ]
    for args, code, text in cases:
        result = daemon.cli(*args)
        assert result.returncode == code, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (args, result.stderr)
    missing = daemon.cli("submit", "--mem", "1G")
    assert missing.returncode == 2


def test_history_by_state_and_since(fresh_daemon: RunningDaemon) -> None:
    daemon = fresh_daemon
    ok = daemon.submit("--mem", "1G", "--", "true")
    bad = daemon.submit("--mem", "1G", "--", "false")
    daemon.client().wait([ok, bad], timeout=20)

    def ids(*args: str) -> list[int]:
        result = daemon.cli("history", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [job["id"] for job in json.loads(result.stdout)]

    assert ids("--state", "failed") == [bad]
    assert ids("--state", "done,failed", "--since", "10m") == [bad, ok]
    assert ids("--state", "done", "--state", "lost") == [ok]
    assert ids("--since", "2999-01-01") == []
    assert ids("--since", "2000-01-01T00:00+00:00") == [bad, ok]
    # The protocol wants a zone: a naive time would be read in the daemon's zone.
    with pytest.raises(UsageError, match="has no time zone"):
        daemon.client().history(since="2026-11-21T08:00")
    table = daemon.cli("history", "--state", "failed").stdout.splitlines()
    assert len(table) == 2 and table[1].split()[:3] == [str(bad), "root", "failed"]


def test_drain_holds_the_queue_across_a_restart_and_undrain_lets_it_go(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory().start()
    running = daemon.submit("--mem", "1G", "--", "sleep", "1")
    daemon.wait_state(running, {"running"})
    drained = daemon.cli("drain", "disk", "swap")
    assert drained.returncode == 0, drained.stderr
    assert "(by root: disk swap): no new job starts" in drained.stdout
    queued = daemon.submit("--mem", "1G", "--", "true")

    def held_back() -> bool:
        job = daemon.show(queued)
        return job["state"] == "queued" and "draining since" in (job["waiting_reason"] or "")

    eventually(held_back)
    assert daemon.wait_state(running, {"done"})["state"] == "done"  # running jobs go on
    screen = daemon.cli("status").stdout.splitlines()
    assert screen[0].startswith("draining since") and "(by root: disk swap)" in screen[0]
    assert json.loads(daemon.cli("status", "--json").stdout)["drain"]["reason"] == "disk swap"
    # Kept across a restart: the queue still waits, and the log says why.
    daemon.stop()
    daemon.start()
    eventually(held_back)
    assert "no new job starts until `gpusched undrain`" in daemon.stderr()
    assert daemon.cli("undrain").returncode == 0
    assert daemon.wait_state(queued, {"done"})["state"] == "done"
    assert json.loads(daemon.cli("status", "--json").stdout)["drain"] is None


def test_cancel_all_from_the_command_line(daemon: RunningDaemon) -> None:
    held = [daemon.submit("--hold", "--mem", "1G", "--", "true") for _ in range(2)]
    result = daemon.cli("cancel", "--all", "--waiting")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"job {i}: cancelled" for i in held]
    again = daemon.cli("cancel", "--all", "--json")
    assert (again.returncode, json.loads(again.stdout)) == (0, [])


def test_no_daemon_exits_3_naming_the_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "nobody-here.sock"
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSCHED_CONFIG", "GPUSCHED_SOCKET")}
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "gpusched", "--socket", str(socket_path), "status"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 3
    assert str(socket_path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_history_and_json_outputs(fresh_daemon: RunningDaemon) -> None:
    daemon = fresh_daemon
    ids: list[int] = []
    for i in range(3):
        # One after another: jobs that run together may end in any order, and history
        # lists by end, newest first.
        ids.append(daemon.submit("--mem", "1G", "--name", f"run{i}", "--", "true"))
        daemon.client().wait(ids[-1:], timeout=20)
    result = daemon.cli("history", "--json", "--limit", "2")
    jobs = json.loads(result.stdout)
    assert [j["id"] for j in jobs] == [ids[2], ids[1]]
    required = {
        "id",
        "name",
        "user",
        "uid",
        "state",
        "command",
        "cwd",
        "mem",
        "gpus",
        "gpu_indices",
        "gpu_uuids",
        "priority",
        "after",
        "submitted_at",
        "started_at",
        "ended_at",
        "pid",
        "exit_code",
        "reason",
        "waiting_reason",
        "log_path",
        "peak_mem",
        "mean_util",
        "hints",
    }
    assert required <= set(jobs[0])
    submitted = json.loads(daemon.cli("submit", "--json", "--mem", "1G", "--", "true").stdout)
    assert submitted["state"] in {"queued", "running", "done"}
    human = daemon.cli("history")
    assert "run2" in human.stdout and "run0" in human.stdout


def test_dependencies_run_in_order_and_a_failed_one_cancels_its_dependents(
    daemon: RunningDaemon,
) -> None:
    first = daemon.submit("--mem", "1G", "--", "sleep", "2")
    second = daemon.submit("--mem", "1G", "--after", str(first), "--", "true")
    jobs = {j["id"]: j for j in daemon.status()["jobs"]}
    if first in jobs:  # on a loaded machine the first may be over already
        assert jobs[second]["state"] == "queued"
        assert jobs[second]["waiting_reason"] in (
            f"waiting for job {first}",
            "waiting for the next scheduling pass",
        )
    job = daemon.wait_state(second, {"done"})
    assert job["started_at"] >= daemon.show(first)["ended_at"]
    failing = daemon.submit("--mem", "1G", "--", "false")
    dependent = daemon.submit("--mem", "1G", "--after", str(failing), "--", "true")
    job = daemon.wait_state(dependent, {"cancelled"})
    assert job["reason"] == "dependency_failed"


@pytest.mark.parametrize("command", [["/nonexistent/program"], ["./not-executable.sh"]])
def test_a_job_that_cannot_start_fails_with_the_cause(
    daemon: RunningDaemon, tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "not-executable.sh").write_text("echo hi\n")
    # Submit refuses such a command (tests/test_submit_program.py) unless it is held: the
    # daemon's own report of the failed start is what is tested here.
    job_id = daemon.submit("--hold", "--mem", "1G", "--cwd", str(tmp_path), "--", *command)
    assert daemon.cli("release", str(job_id)).returncode == 0
    job = daemon.wait_state(job_id, {"failed"})
    assert job["reason"] == "failed_to_start"
    assert command[0] in job["reason_detail"]
    follow_up = daemon.submit("--mem", "1G", "--", "true")
    assert daemon.wait_state(follow_up, {"done"})["exit_code"] == 0
