"""Refuse at submit what can never start (issue 28, item 3): the program is looked up on
the submitter's PATH, then in the job's directory, in the submitter's own process; a
command that could never run is a one-line error with a hint (exit 2) instead of a job
that ends `failed_to_start`; held and `--after` jobs only get a warning."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A directory to submit from, like a user's project."""
    made = tmp_path / "work"
    made.mkdir()
    return made


@pytest.fixture
def debian_path(tmp_path: Path) -> str:
    """A PATH like Debian 12's: python3, no `python`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("sh", "true", "echo"):
        (bin_dir / tool).symlink_to(f"/bin/{tool}")
    return str(bin_dir)


def submit(daemon: RunningDaemon, cwd: Path, path: str, *args: str) -> Any:
    return daemon.cli("submit", *args, cwd=cwd, env={**daemon.env, "PATH": path})


def test_python_missing_while_python3_exists_is_refused_with_the_hint(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    done = submit(daemon, work, debian_path, "--mem", "1G", "--", "python", "-c", "print(1)")
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert "command not found: python" in done.stderr
    assert "use python3" in done.stderr
    assert daemon.status("--all")["jobs"] == []  # nothing queued


def test_a_whole_command_line_in_one_string_is_refused(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    done = submit(daemon, work, debian_path, "--mem", "1G", "python3 -c print(1)")
    assert done.returncode == 2
    assert "a command line in one string: use sh -c or split it" in done.stderr


def test_an_executable_in_the_directory_runs_as_dot_slash(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    script = work / "train.sh"
    script.write_text("#!/bin/sh\necho trained in $(pwd)\n")
    script.chmod(0o755)
    job = int(submit(daemon, work, debian_path, "--mem", "1G", "train.sh").stdout)
    ended = daemon.wait_state(job, {"done", "failed"})
    assert (ended["state"], ended["command"]) == ("done", ["./train.sh"]), ended
    # The same holds for an executable train.py (the README's rule covers only a script
    # that is not executable: it runs with the python on the PATH).
    (work / "train.py").write_text(f"#!{sys.executable}\nprint('ok')\n")
    (work / "train.py").chmod(0o755)
    job = int(submit(daemon, work, debian_path, "--mem", "1G", "train.py").stdout)
    ended = daemon.wait_state(job, {"done", "failed"})
    assert (ended["state"], ended["command"]) == ("done", ["./train.py"]), ended


def test_paths_and_files_that_cannot_run_are_refused(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    (work / "prepare").write_text("echo not executable\n")
    cases = {
        "./missing.sh": "no such file",
        "./prepare": "it is not executable",
        "prepare": "./prepare is not executable",
        "nosuchprogram": "not on your PATH, not in",
    }
    for program, said in cases.items():
        done = submit(daemon, work, debian_path, "--mem", "1G", program)
        assert done.returncode == 2, (program, done.stdout)
        assert said in done.stderr, (program, done.stderr)


def test_held_and_after_jobs_are_warned_not_refused(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    held = submit(daemon, work, debian_path, "--mem", "1G", "--hold", "./build/train")
    assert held.returncode == 0, held.stderr
    assert "warning: cannot run ./build/train: no such file" in held.stderr
    first = int(held.stdout)
    after = submit(daemon, work, debian_path, "--mem", "1G", "--after", str(first), "python")
    assert after.returncode == 0, after.stderr
    assert "warning: command not found: python" in after.stderr


def test_a_sweep_with_a_placeholder_program_is_left_to_its_values(
    daemon: RunningDaemon, work: Path, debian_path: str
) -> None:
    done = submit(
        daemon, work, debian_path, "--mem", "1G", "--sweep", "tool=true,echo", "--", "{tool}"
    )
    assert done.returncode == 0, done.stderr


def test_the_submitters_path_decides_not_the_daemons(
    daemon: RunningDaemon, work: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "mybin"
    mine.mkdir()
    tool = mine / "only-mine"
    tool.write_text("#!/bin/sh\necho mine\n")
    tool.chmod(0o755)
    path = f"{mine}:{os.environ['PATH']}"
    job = int(submit(daemon, work, path, "--mem", "1G", "only-mine").stdout)
    assert daemon.wait_state(job, {"done", "failed"})["state"] == "done"
