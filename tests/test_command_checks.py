"""`run` refuses a command that could never start as `submit` does, before it queues;
both refuse an interpreter's script that is not there (`python3 missing.py`, `submit --
missing.py`) in one line, and a held job only gets a warning. The real command line
against a real daemon on simulated GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.daemon_harness import RunningDaemon


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    return shared_daemon


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "--mem", "1G", "--", "nosuchcmd"], "gpusched: command not found: nosuchcmd"),
        (["run", "--mem", "1G", "--", "python3", "missing.py"], "gpusched: cannot run missing.py"),
        (["submit", "--mem", "1G", "--", "missing.py"], "gpusched: cannot run missing.py"),
        (["submit", "--mem", "1G", "--", "python3", "missing.py"], "gpusched: cannot run missing"),
        (["submit", "--mem", "1G", "python3", "missing.py"], "gpusched: cannot run missing.py"),
    ],
)
def test_a_command_that_cannot_start_is_refused_before_it_queues(
    daemon: RunningDaemon, tmp_path: Path, args: list[str], said: str
) -> None:
    before = daemon.status("--all")["jobs"]
    done = daemon.cli(*args, cwd=tmp_path)
    assert done.returncode == 2, done
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
    assert daemon.status("--all")["jobs"] == before  # nothing queued


def test_a_script_that_is_there_runs_and_a_held_one_is_only_warned_of(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    (tmp_path / "here.py").write_text("print('here')\n")
    done = daemon.cli("run", "--mem", "1G", "--", sys.executable, "here.py", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "here\n"), done.stderr
    held = daemon.cli("submit", "--hold", "--mem", "1G", "--", "python3", "later.py", cwd=tmp_path)
    assert held.returncode == 0, held.stderr
    assert "warning: cannot run later.py: no such file" in held.stderr
