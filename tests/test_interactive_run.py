"""`gpusched run` end to end: a real daemon on simulated GPUs, the real CLI on a
pseudo-terminal (and once in tmux), real commands, Ctrl-C typed into the terminal.

One daemon serves the module where a test touches only its own job (`daemon`); a restart,
other users, or a card's whole accounting take one of their own."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.client import Client
from gpusched.core.errors import PermissionDenied
from tests.daemon_harness import RunningDaemon, eventually
from tests.terminal import Terminal, Tmux
from tests.users import as_user, throwaway_users

RUN = [sys.executable, "-m", "gpusched", "run"]
SHELL = ["bash", "--norc", "--noprofile"]


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon (conftest.py `shared_daemon`): every job of the test is its own,
    and its terminals are closed (fixtures end in reverse) before the daemon's cleanup."""
    return shared_daemon


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def run_on_a_terminal(daemon: RunningDaemon, terminals: list[Terminal], *args: str) -> Terminal:
    terminal = Terminal([*RUN, *args], daemon.env)
    terminals.append(terminal)
    return terminal


def running_job(daemon: RunningDaemon) -> int:
    """The id of a running job, or 0 (false: `eventually` tries again)."""
    return next((j.id for j in daemon.client().status().jobs if j.state == "running"), 0)


def job_id_of(terminal: Terminal) -> int:
    return int(terminal.expect(r"job (\d+) (running|waiting)").group(1))


def test_the_command_runs_on_the_terminal_with_its_gpu_and_its_exit_code(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    script = (
        "import os, sys; print('tty', sys.stdin.isatty(), sys.stdout.isatty());"
        " print('env', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'],"
        " os.environ['GPUSCHED_JOB_ID']); sys.exit(int(input('code? ')))"
    )
    terminal = run_on_a_terminal(
        daemon, terminals, "--mem", "4G", "--", sys.executable, "-c", script
    )
    job = job_id_of(terminal)
    terminal.expect("code\\? ")
    terminal.send(b"7\n")  # the command reads the terminal: it is in the foreground
    assert terminal.wait() == 7
    assert "tty True True" in terminal.output
    assert f"env 0 PCI_BUS_ID {job}" in terminal.output
    ended = daemon.show(job)
    assert (ended["state"], ended["exit_code"], ended["reason"]) == ("failed", 7, "exit")
    assert ended["mem"] == 4 * 2**30
    history = daemon.cli("history", "--json")
    assert job in [j["id"] for j in json.loads(history.stdout)]


def test_a_command_killed_by_a_signal_exits_128_plus_n(daemon: RunningDaemon) -> None:
    result = daemon.cli("run", "--mem", "1G", "--", "sh", "-c", "kill -USR1 $$")
    assert result.returncode == 128 + signal.SIGUSR1
    job = int(re.search(r"job (\d+)", result.stderr).group(1))  # type: ignore[union-attr]
    ended = daemon.show(job)
    assert (ended["state"], ended["reason"], ended["exit_code"]) == ("failed", "signal", 138)
    ok = daemon.cli("run", "--mem", "1G", "--", "true")
    assert ok.returncode == 0
    missing = daemon.cli("run", "--mem", "1G", "--", "/no/such/program")
    assert missing.returncode == 2  # refused before it queues, as submit refuses it
    assert missing.stderr == "gpusched: cannot run /no/such/program: no such file\n"


def test_ctrl_c_while_waiting_withdraws_the_job(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    for _ in range(2):  # two whole-GPU jobs take both simulated cards
        daemon.wait_state(daemon.submit("--", "sleep", "60"), {"running"})
    terminal = run_on_a_terminal(daemon, terminals, "--mem", "1G", "--", "true")
    job = int(terminal.expect(r"job (\d+) waiting: needs 1.0G").group(1))
    terminal.send(b"\x03")
    assert terminal.wait() == 130
    assert "cancelled before it started" in terminal.output
    assert daemon.show(job)["state"] == "cancelled"


def test_ctrl_c_while_running_goes_to_the_command_alone(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    trapping = "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.1; done"
    terminal = run_on_a_terminal(daemon, terminals, "--mem", "1G", "--", "sh", "-c", trapping)
    job = job_id_of(terminal)
    terminal.expect("ready")
    terminal.send(b"\x03")
    assert terminal.wait() == 7  # the client lived on to pass the command's status through
    assert "got-int" in terminal.output
    assert (daemon.show(job)["state"], daemon.show(job)["exit_code"]) == ("failed", 7)

    default = run_on_a_terminal(
        daemon, terminals, "--mem", "1G", "--", "sh", "-c", "echo up; sleep 60"
    )
    job = job_id_of(default)
    default.expect("up")
    # Not at once: a Ctrl-C between dash's echo and its fork of sleep is held by dash
    # until sleep ends (dash's own race, as at any prompt; a person types slower).
    time.sleep(0.5)
    default.send(b"\x03")
    assert default.wait() == 130
    assert daemon.show(job)["reason"] == "signal"


def test_ctrl_c_reaches_the_command_with_stdin_redirected(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    """The terminal is found through /dev/tty when stdin is not it."""
    run = " ".join(RUN)
    trapping = "trap 'echo got-int; exit 9' INT; echo ready; while :; do sleep 0.1; done"
    terminal = Terminal(
        ["sh", "-c", f'exec {run} --mem 1G -- sh -c "{trapping}" < /dev/null'], daemon.env
    )
    terminals.append(terminal)
    terminal.expect("ready")
    terminal.send(b"\x03")
    assert terminal.wait() == 9
    assert "got-int" in terminal.output


def test_a_killed_client_releases_its_gpu_within_a_poll_and_takes_its_command(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    client = subprocess.Popen(
        [*RUN, "--mem", "20G", "--", "sleep", "60"],
        env=daemon.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = eventually(lambda: running_job(daemon))
        command = eventually(lambda: psutil.Process(client.pid).children())[0]
        assert daemon.show(job)["pid"] == client.pid  # the client is the job's process
        client.kill()
        client.wait()
        killed_at = time.monotonic()
        ended = daemon.wait_state(job, {"lost"}, timeout=10)
        assert time.monotonic() - killed_at < 4.0  # a poll is 1s here (the rest: a busy machine)
        assert "ended without reporting" in ended["reason_detail"]
        eventually(lambda: not command.is_running() or command.status() == psutil.STATUS_ZOMBIE)
        gpu = next(g for g in daemon.status()["gpus"] if g["index"] == ended["gpu_indices"][0])
        assert gpu["reserved"] == 0 and job not in gpu["jobs"]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_time_limit_stops_the_command_and_says_so(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    terminal = run_on_a_terminal(
        daemon, terminals, "--mem", "1G", "--time", "2s", "--", "sleep", "60"
    )
    job = job_id_of(terminal)
    assert terminal.wait() == 128 + signal.SIGTERM
    assert "ran longer than its time limit of 2s: stopping sleep" in terminal.output
    ended = daemon.show(job)
    assert (ended["state"], ended["reason"]) == ("failed", "timeout")


def _left_behind(marker: str) -> list[psutil.Process]:
    """The processes whose command line is `sleep MARKER` (what a test's command left)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == ["sleep", marker]:
            found.append(process)
    return found


def test_what_the_command_left_after_setsid_ends_with_the_time_limit(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    """Issue 27 item 8: a double-forked, setsid'd process (out of the command's process
    group and session) outlived `--time`, keeping the card's CUDA_VISIBLE_DEVICES."""
    marker = str(330_000 + os.getpid() % 10_000)
    escape = f"(setsid sleep {marker} &); echo ready; sleep 100"
    terminal = run_on_a_terminal(
        daemon, terminals, "--mem", "1G", "--time", "3s", "--", "sh", "-c", escape
    )
    job = job_id_of(terminal)
    terminal.expect("ready")
    assert eventually(lambda: _left_behind(marker))  # it escaped the group: it runs
    try:
        assert terminal.wait() == 128 + signal.SIGTERM
        ended = daemon.show(job)
        assert (ended["state"], ended["reason"]) == ("failed", "timeout")
        assert _left_behind(marker) == []  # gone before the client reported the end
    finally:
        for process in _left_behind(marker):
            process.kill()


def test_what_a_command_leaves_when_it_exits_is_ended_even_if_it_ignores_sigterm(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    """The same rule as a batch job's: the reservation ends with the command, and so does
    everything it started (SIGTERM, then SIGKILL after kill_grace, 2s here)."""
    marker = str(340_000 + os.getpid() % 10_000)
    stubborn = f"trap '' TERM; exec sleep {marker}"
    escape = f"(setsid sh -c {stubborn!r} &); sleep 0.5; exit 0"
    terminal = run_on_a_terminal(daemon, terminals, "--mem", "1G", "--", "sh", "-c", escape)
    job = job_id_of(terminal)
    try:
        assert terminal.wait() == 0
        assert daemon.show(job)["state"] == "done"
        assert _left_behind(marker) == []
    finally:
        for process in _left_behind(marker):
            process.kill()


def test_a_stubborn_command_is_killed_after_kill_grace(
    daemon: RunningDaemon, terminals: list[Terminal]
) -> None:
    stubborn = "trap '' TERM; echo ready; while :; do sleep 0.1; done"
    terminal = run_on_a_terminal(daemon, terminals, "--mem", "1G", "--", "sh", "-c", stubborn)
    job = job_id_of(terminal)
    terminal.expect("ready")
    assert daemon.cli("cancel", str(job)).returncode == 0
    assert terminal.wait() == 128 + signal.SIGKILL  # kill_grace is 2s here
    assert "cancelled by" in terminal.output
    assert daemon.show(job)["state"] == "cancelled"


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A daemon directory every user can traverse (pytest's tmp dirs are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-run-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_only_the_client_process_may_wait_for_or_end_its_job(shared_root: Path) -> None:
    daemon = RunningDaemon(shared_root).start()
    client_process = subprocess.Popen(
        [*RUN, "--mem", "1G", "--", "sleep", "60"],
        env=daemon.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job = eventually(lambda: running_job(daemon))
        client = daemon.client()  # the same user, another process
        with pytest.raises(PermissionDenied, match="another process"):
            client.request("run_ended", id=job, exit_code=0)
        with pytest.raises(PermissionDenied, match="another process"):
            client.request("placement", id=job, timeout=0)
        socket_path = str(daemon.socket_path)
        with throwaway_users(1) as ([bob], _):

            def end_roots_job() -> Any:
                return Client(socket_path).request("run_ended", id=job, exit_code=0)

            def cancel_roots_job() -> Any:
                return Client(socket_path).cancel(job).to_json()

            def own_run() -> Any:  # bob's own, from this forked process: its pid is the job's
                queued = Client(socket_path).request("run", command=["python"], cwd="/", mem=2**30)
                return [queued["id"], queued["uid"], queued["pid"], os.getpid()]

            for attempt in (end_roots_job, cancel_roots_job):
                with pytest.raises(PermissionDenied, match="belongs to root"):
                    as_user(bob, attempt)
            bobs, uid, pid, asker = as_user(bob, own_run)
            assert (uid, pid) == (bob.uid, asker)  # who asked, from the socket
            # That process has exited (as_user's child): its job ends within a poll.
            ended = daemon.wait_state(bobs, {"cancelled", "lost"}, timeout=10)
            assert "client process" in ended["reason_detail"]
        assert daemon.show(job)["state"] == "running"
    finally:
        client_process.kill()
        client_process.wait()
        daemon.stop()
        daemon.kill_jobs()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_shell_under_tmux_behaves_as_a_person_sees_it(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    session = f"gpusched-test-{os.getpid()}"
    status_file = tmp_path / "rc"
    env = {**daemon.env, "PS1": "gpu$ ", "TMUX": ""}
    env.pop("TMUX")
    command = (
        f"{sys.executable} -m gpusched run --mem 2G -- bash --norc --noprofile;"
        f" echo rc=$? > {status_file}"
    )
    tmux = Tmux(session, ["sh", "-c", command], env)
    screen, keys = tmux.screen, tmux.keys

    try:
        eventually(lambda: "gpu$" in screen(), describe=screen)
        keys("echo GPU=$CUDA_VISIBLE_DEVICES job=$GPUSCHED_JOB_ID", "Enter")
        eventually(lambda: re.search(r"^GPU=\d job=\d+", screen(), re.M), describe=screen)
        job = int(re.search(r"^GPU=\d job=(\d+)", screen(), re.M).group(1))  # type: ignore[union-attr]
        assert daemon.show(job)["state"] == "running"
        keys("sleep 60; echo after-sleep", "Enter")
        time.sleep(0.5)
        keys("C-c")  # Ctrl-C stops the sleep, not the shell, nor gpusched
        eventually(lambda: screen().rstrip().endswith("gpu$"), describe=screen)
        assert "after-sleep" not in screen().replace("echo after-sleep", "")
        assert daemon.show(job)["state"] == "running"
        keys("exit 5", "Enter")
        eventually(status_file.exists, describe=screen)
        assert status_file.read_text().strip() == "rc=5"
        ended = daemon.show(job)
        assert (ended["state"], ended["exit_code"]) == ("failed", 5)
    finally:
        tmux.close()


def test_an_interactive_job_outlives_a_daemon_restart(
    fresh_daemon: RunningDaemon, tmp_path: Path
) -> None:
    daemon = fresh_daemon  # restarted: not the module's
    go = tmp_path / "go"
    client = subprocess.Popen(
        [*RUN, "--mem", "2G", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 4"],
        env=daemon.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        job = eventually(lambda: running_job(daemon))
        daemon.stop()
        daemon.start()
        assert daemon.show(job)["state"] == "running"  # its client lives: re-adopted as is
        daemon.stop()
        go.touch()  # the command ends while no daemon answers: its client asks again
        time.sleep(1.5)
        assert client.poll() is None
        daemon.start()
        assert client.wait(timeout=60) == 4
        ended = daemon.show(job)
        assert (ended["state"], ended["exit_code"]) == ("failed", 4)
    finally:
        client.kill()
        client.communicate()


def test_an_interactive_job_and_batch_jobs_share_a_card_without_overcommit(
    daemon_factory: Any,
) -> None:
    daemon = daemon_factory(simulate="1x24G").start()
    client = subprocess.Popen(
        [*RUN, "--mem", "10G", "--", "sleep", "60"],
        env=daemon.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        interactive = eventually(lambda: running_job(daemon))
        beside = daemon.submit("--mem", "10G", "--", "sleep", "60")
        assert daemon.wait_state(beside, {"running"})["gpu_indices"] == [0]
        third = daemon.submit("--mem", "10G", "--", "true")
        waiting = daemon.wait_reason(third, "needs 10.0G")
        assert waiting["state"] == "queued"
        gpu = daemon.status()["gpus"][0]
        assert sorted(gpu["jobs"]) == sorted([interactive, beside])
        client.kill()  # the interactive job's end frees its share for the third
        client.wait()
        assert daemon.wait_state(third, {"done"})["gpu_indices"] == [0]
    finally:
        client.kill()
        client.wait()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_ctrl_z_stops_the_job_and_fg_resumes_it_in_a_shell(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    session = f"gpusched-jobctl-{os.getpid()}"
    env = {**daemon.env, "PS1": "sh$ "}
    env.pop("TMUX", None)
    tmux = Tmux(session, SHELL, env)
    screen, keys = tmux.screen, tmux.keys

    try:
        eventually(lambda: "sh$" in screen(), describe=screen)
        keys(f"{sys.executable} -m gpusched run --mem 1G -- sleep 60", "Enter")
        running = eventually(lambda: re.findall(r"job (\d+) running", screen()), describe=screen)
        job = int(running[0])
        time.sleep(0.5)
        keys("C-z")  # the command stops, and so does gpusched run: the shell has its prompt
        eventually(lambda: "Stopped" in screen(), describe=screen)
        assert daemon.show(job)["state"] == "running"  # stopped is not gone
        keys("fg", "Enter")
        time.sleep(0.5)
        keys("C-c")
        keys("echo rc=$?", "Enter")
        eventually(lambda: "rc=130" in screen(), describe=screen)
        ended = daemon.show(job)
        assert (ended["state"], ended["reason"]) == ("failed", "signal")
    finally:
        tmux.close()
