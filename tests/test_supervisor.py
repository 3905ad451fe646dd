"""The supervisor with real jobs: cancel leaves no process behind, and the log cap holds.

Each job runs under a real `python -m gpusched.processes.supervisor SPEC`, marked with an
environment variable of its own, so any process it left behind (re-parented to init
once the supervisor is gone) is found by that mark.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.processes.logcap import MARKER_BYTES, cap_log, head_bytes, read_log
from tests.daemon_harness import eventually

# Each ignores SIGTERM (so do its children: an ignored signal stays ignored across exec),
# so the grace period ends with the tree still forking when the SIGKILLs start.
FORK_LOOP = "trap '' TERM; while :; do sleep 100 & done"
# A process that forks continuously and lets each parent exit: its pid keeps changing,
# so a listing is stale before it can be signalled (and a scan of /proc may miss it too:
# each generation appends a byte to $GPUSCHED_TEST_BEAT, which shows it still runs).
PID_HOPPER = """
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
beat = os.open(os.environ["GPUSCHED_TEST_BEAT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
while True:
    try:
        os.write(beat, b".")
        if os.fork() != 0:
            os._exit(0)
    except OSError:
        pass
"""
HOPPING = f"trap '' TERM; {sys.executable} -c '{PID_HOPPER}' & while :; do sleep 100; done"
# A daemon the job does not wait for (double fork, setsid) that itself forks on and on.
DAEMONIZER = (
    f"trap '' TERM; (setsid {sys.executable} -c '{PID_HOPPER}' &); while :; do sleep 100; done"
)


def marked(mark: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("GPUSCHED_TEST_MARK") == mark:
                found.append(process)
        except psutil.Error:
            continue
    return found


class Run:
    """One job under a real supervisor process."""

    def __init__(self, tmp: Path, argv: list[str], **spec: Any) -> None:
        self.mark = uuid.uuid4().hex
        self.log_path = tmp / "job.log"
        self.exit_path = tmp / "exit.json"
        self.beat = tmp / "beat"
        env = {
            "PATH": os.environ["PATH"],
            "GPUSCHED_TEST_MARK": self.mark,
            "GPUSCHED_TEST_BEAT": str(self.beat),
        }
        full = {
            "job_id": 1,
            "argv": argv,
            "cwd": str(tmp),
            "env": env,
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": [],
            "umask": 0o077,
            "log_path": str(self.log_path),
            "kill_grace_s": 0.5,
            "time_limit_s": None,
            **spec,
        }
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(full))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpusched.processes.supervisor", str(spec_path)],
            start_new_session=True,
        )

    def outcome(self) -> dict[str, Any]:
        self.process.wait(timeout=60)
        result: dict[str, Any] = json.loads(self.exit_path.read_text())
        return result

    def left_running(self) -> list[int]:
        """Pids of the job still running (after its supervisor has exited); [-1] for a
        pid hopper that is still beating."""
        left = [p.pid for p in marked(self.mark) if p.status() != psutil.STATUS_ZOMBIE]
        before = self.beat.stat().st_size if self.beat.exists() else 0
        time.sleep(0.3)  # a window to see a hopper beat: it hops every millisecond or so
        after = self.beat.stat().st_size if self.beat.exists() else 0
        return left + ([-1] if after != before else [])

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for process in marked(self.mark):  # what a failed test left: not for the next one
            with contextlib.suppress(psutil.Error):
                process.kill()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    runs: list[Run] = []

    def start(argv: list[str], **spec: Any) -> Run:
        runs.append(Run(tmp_path, argv, **spec))
        return runs[-1]

    yield start
    for each in runs:
        each.cleanup()


@pytest.mark.parametrize("late", [True, False], ids=["past-the-deadline", "inside-it"])
def test_the_supervisor_execs_nothing_past_its_cluster_node_s_launch_deadline(
    run: Any, tmp_path: Path, late: bool
) -> None:
    """A cluster node's launch deadline (CLOCK_MONOTONIC, the daemon's and the
    supervisor's alike): past it the command never runs, and the record says so as a
    transient failure to start (the job goes back to the queue)."""
    ran = tmp_path / "ran"
    exec_by = time.monotonic() + (-0.1 if late else 60)
    outcome = run(["touch", str(ran)], exec_by=exec_by).outcome()
    if late:
        assert outcome["outcome"] == "failed_to_start"
        assert outcome["transient"] is True
        assert "lease ran out" in outcome["message"]
        assert not ran.exists()
    else:
        assert (outcome["outcome"], outcome["exit_code"]) == ("exit", 0)
        assert ran.exists()


def test_a_job_that_cannot_be_fenced_off_the_other_cards_is_not_started(
    run: Any, tmp_path: Path
) -> None:
    """Its devices cgroup cannot be made (here: no parent to make it in): the job would
    run with every card open, so its command never runs, and the end says why."""
    ran = tmp_path / "ran"
    fence = {"path": str(tmp_path / "no-such-cgroup" / "job-1"), "deny": ["c 195:1 rwm"]}
    outcome = run(["touch", str(ran)], devices=fence).outcome()
    assert outcome["outcome"] == "failed_to_start"
    assert outcome["transient"] is False
    assert outcome["message"].startswith("cannot fence off the GPUs it was not given: ")
    assert not ran.exists()


def test_a_supervisor_runs_no_program_but_its_job(tmp_path: Path) -> None:
    """Each program a supervisor starts is paid by every job's dispatch: with its
    private /dev/shm set up and released (as root; tried and refused otherwise), it
    execs the job and nothing else (ctypes.util.find_library ran `ldconfig -p` twice a
    job for that, 3-5 ms each)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    spec = {
        "job_id": 1,
        "argv": ["true"],
        "cwd": str(tmp_path),
        "env": {"PATH": os.environ["PATH"]},
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": [],
        "umask": 0o077,
        "log_path": str(tmp_path / "job.log"),
        "kill_grace_s": 0.5,
        "time_limit_s": None,
        "private_shm": True,
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    supervisor = [sys.executable, "-m", "gpusched.processes.supervisor", str(spec_path)]
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", *supervisor],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    outcome = json.loads((tmp_path / "exit.json").read_text())
    assert (outcome["outcome"], outcome["exit_code"]) == ("exit", 0)
    programs = re.findall(r'execve\("([^"]*)"', done.stderr)
    assert programs[0] == sys.executable  # the supervisor itself
    # The job's `true`, tried along PATH: no other program.
    assert programs[1:] and all(Path(p).name == "true" for p in programs[1:]), programs


_AT_FORK_PROBE = """
import os, sys
from pathlib import Path
marker = Path(sys.argv[2])
os.register_at_fork(after_in_child=lambda: marker.write_text("Python ran in a forked child"))
from gpusched.processes.supervisor import main
sys.exit(main(sys.argv[:2]))
"""


def test_the_job_s_fork_runs_no_python_in_the_child(tmp_path: Path) -> None:
    """The job is forked from the supervisor and exec'd without Python code in between
    (no preexec_fn: that runs the interpreter's at-fork hooks in the child and copies
    the pages it touches, about a millisecond a job); its directory is entered as its
    owner beforehand (credentials.in_owners_directory, tests/security/test_privileges)."""
    spec = {
        "job_id": 1,
        "argv": ["sh", "-c", "pwd"],
        "cwd": str(tmp_path),
        "env": {"PATH": os.environ["PATH"]},
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": [],
        "umask": 0o077,
        "log_path": str(tmp_path / "job.log"),
        "kill_grace_s": 0.5,
        "time_limit_s": None,
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    marker = tmp_path / "forked-python"
    subprocess.run(
        [sys.executable, "-c", _AT_FORK_PROBE, str(spec_path), str(marker)],
        timeout=60,
        check=True,
        cwd="/",
    )
    outcome = json.loads((tmp_path / "exit.json").read_text())
    assert (outcome["outcome"], outcome["exit_code"]) == ("exit", 0)
    assert (tmp_path / "job.log").read_text().strip() == str(tmp_path)  # in its directory
    assert not marker.exists()


@pytest.mark.parametrize(
    "argv",
    [["sh", "-c", HOPPING], ["sh", "-c", DAEMONIZER]],
    ids=["pid-hopper", "setsid-daemon-that-forks"],
)
def test_cancel_leaves_no_process_of_a_job_that_forks_continuously(
    run: Any, argv: list[str]
) -> None:
    job = run(argv)
    eventually(lambda: job.beat.exists() and job.beat.stat().st_size > 100)  # hopping away
    job.process.send_signal(signal.SIGTERM)
    assert job.outcome()["outcome"] == "cancelled"
    # Written after the tree is gone: nothing of the job runs on under init.
    assert job.left_running() == []


def test_a_main_process_that_exits_leaves_no_forking_orphan(run: Any) -> None:
    job = run(["sh", "-c", f'(setsid sh -c "{FORK_LOOP}" &); sleep 0.5'])
    outcome = job.outcome()
    assert (outcome["outcome"], outcome["exit_code"]) == ("exit", 0)
    assert job.left_running() == []


def test_a_job_writing_as_fast_as_it_can_stays_within_the_log_cap(run: Any) -> None:
    cap = 256 * 1024
    job = run(["yes", "output"], max_log_bytes=cap)
    log = job.log_path
    eventually(lambda: b"bytes of output dropped" in head_of(log), timeout=30)
    job.process.send_signal(signal.SIGTERM)
    assert job.outcome()["outcome"] == "cancelled"
    data = log.read_bytes()
    assert len(data) <= cap
    head = head_bytes(cap)
    assert data[:head] == (b"output\n" * head)[:head]  # how it started, kept
    marker = data[head : head + MARKER_BYTES]
    assert marker.startswith(b"\n[gpusched: ") and b"bytes of output dropped" in marker
    # Then its latest output, from a line's start (`yes` was killed in mid-write).
    *whole, last = data[head + MARKER_BYTES :].split(b"\n")
    assert len(whole) > 1000 and set(whole) == {b"output"} and b"output".startswith(last)


def head_of(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(64 * 1024 + MARKER_BYTES)
    except FileNotFoundError:
        return b""


def lines(first: int, last: int) -> bytes:
    return b"".join(b"%08d\n" % n for n in range(first, last))


def test_cap_log_keeps_head_and_latest_tail_with_a_marker_counting_the_drop(
    tmp_path: Path,
) -> None:
    cap = 64 * 1024
    path = tmp_path / "log"
    path.write_bytes(lines(0, 20000))  # 180000 bytes
    fd = os.open(path, os.O_RDWR)
    try:
        assert cap_log(fd, cap) > 0
        data = path.read_bytes()
        head = head_bytes(cap)
        assert len(data) <= cap
        assert data[:head] == lines(0, 20000)[:head]
        assert data[head : head + MARKER_BYTES].startswith(b"\n[gpusched: ")
        tail = data[head + MARKER_BYTES :]
        assert lines(0, 20000).endswith(tail) and tail.startswith(b"000")  # whole lines
        dropped = 180000 - head - len(tail)
        assert b"[gpusched: %d bytes of output dropped" % dropped in data
        # A second cut counts everything dropped so far.
        with open(path, "ab") as out:
            out.write(lines(20000, 40000))
        second = cap_log(fd, cap)
        data = path.read_bytes()
        tail = data[head + MARKER_BYTES :]
        assert b"[gpusched: %d bytes of output dropped" % (dropped + second) in data
        assert len(data) <= cap and lines(0, 40000).endswith(tail)
        assert cap_log(fd, cap) == 0  # under the cap: left alone
    finally:
        os.close(fd)


def test_a_follower_reads_everything_not_dropped_once_in_order_across_cuts(
    tmp_path: Path,
) -> None:
    cap = 64 * 1024
    path = tmp_path / "log"
    path.write_bytes(b"")
    writer = os.open(path, os.O_WRONLY | os.O_APPEND)
    cutter = os.open(path, os.O_RDWR)
    reader = os.open(path, os.O_RDONLY)
    seen = b""
    offset = 0
    written = 0
    try:
        for round_ in range(40):
            os.write(writer, lines(written, written + 1500))
            written += 1500
            # The follower reads a little, at different points between cuts.
            for _ in range(round_ % 3):
                data, offset = read_log(reader, offset, 7000)
                seen += data
            cap_log(cutter, cap)
        while True:
            data, offset = read_log(reader, offset, 7000)
            if not data:
                break
            seen += data
    finally:
        for fd in (writer, cutter, reader):
            os.close(fd)
    # Whole lines only: a cut may leave the line it cuts through partial.
    numbers = [int(line) for line in seen.split(b"\n") if len(line) == 8 and line.isdigit()]
    assert numbers == sorted(set(numbers))  # never twice, never out of order
    assert numbers[0] == 0 and numbers[-1] == written - 1  # from the start to the latest
    assert seen.count(b"bytes of output dropped") >= 1
    # Every gap in what it read is announced by a marker.
    gaps = sum(1 for a, b in itertools.pairwise(numbers) if b != a + 1)
    assert gaps <= seen.count(b"bytes of output dropped")


def test_a_reader_past_the_end_of_a_cut_log_restarts_at_the_marker(tmp_path: Path) -> None:
    cap = 64 * 1024
    path = tmp_path / "log"
    path.write_bytes(lines(0, 20000))
    fd = os.open(path, os.O_RDWR)
    try:
        end = os.fstat(fd).st_size
        cap_log(fd, cap)
        # The old end is beyond the new size: the follower is not left waiting there.
        data, offset = read_log(fd, end, 1 << 20)
        assert data == b"" and offset == end  # it had read everything: nothing new, no repeat
        with open(path, "ab") as out:
            out.write(lines(20000, 20001))
        data, offset = read_log(fd, end, 1 << 20)
        assert data == lines(20000, 20001) and offset == end + 9
        # A follower whose next byte was dropped gets the marker, then what follows.
        data, _ = read_log(fd, head_bytes(cap) + 10, 1 << 20)
        assert data.startswith(b"\n[gpusched: ") and data.endswith(lines(19999, 20001))
        # Any offset a client sends is answered (nothing beyond 2**63 reaches pread).
        assert read_log(fd, 2**80, 10) == (b"", 2**80)
    finally:
        os.close(fd)


def test_a_marker_the_job_printed_itself_hides_nothing_from_its_reader(tmp_path: Path) -> None:
    path = tmp_path / "log"
    forged = b"start\n[gpusched: trimming]\n" + lines(0, 100)
    path.write_bytes(forged)
    fd = os.open(path, os.O_RDONLY)
    try:
        seen, offset = b"", 0
        while True:
            data, offset = read_log(fd, offset, 1000, patience_s=0.1)
            if not data:
                break
            seen += data
        assert seen == forged
    finally:
        os.close(fd)
