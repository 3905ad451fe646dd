"""README's first command, as a newcomer pastes it (after its install): it waits for the
daemon rather than sleep and hope, and fails where any step fails. And what it relies
on, `gpusched daemon --detach`: back once the daemon answers, non-zero with the daemon's
error when it cannot start. Real daemons on simulated GPUs, the real command line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpusched.client import Client
from gpusched.core.errors import GpuschedError
from tests.daemon_harness import directory_settings

README = Path(__file__).resolve().parents[1] / "README.md"
# The daemon's dependencies only: a try-out does not wait for the test extra's install.
INSTALL = "pip install -e '.[daemon]' && "


def _first_command() -> str:
    """What README's first `sh` block that starts a daemon runs after its install."""
    for code in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL):
        if "gpusched daemon" in code:
            assert INSTALL in code, code
            return code.split(INSTALL, 1)[1].strip()
    raise AssertionError("README.md shows no command that starts a daemon")


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose daemon keeps everything under tmp_path (a config names the
    directories; the command line's --simulate is README's); the daemon stopped after."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(directory_settings(tmp_path, simulate=None)))
    bin_dir = Path(sys.executable).parent  # gpusched and python: this venv's
    env = {**os.environ, "GPUSCHED_CONFIG": str(config)}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    env["GPUSCHED_SYSTEM_SOCKET"] = str(tmp_path / "no-system" / "gpusched.sock")
    env.pop("GPUSCHED_SOCKET", None)
    yield env
    try:
        pid = int(Client(tmp_path / "gpusched.sock").ping()["pid"])
    except GpuschedError:
        return
    os.kill(pid, signal.SIGTERM)


def _bash(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_first_command_waits_for_the_daemon_and_chains_its_steps() -> None:
    line = _first_command()
    assert "sleep" not in line and "&;" not in line and "& " not in line.replace("&&", "")
    assert line.startswith("gpusched daemon --simulate 2x24G --detach && ")
    assert ";" not in line.replace("os; print", ""), "a `;` would hide a failed step"


def test_the_first_command_runs_and_prints_the_gpu(home: dict[str, str], tmp_path: Path) -> None:
    done = _bash(_first_command(), home, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "GPU 0\n" in done.stdout, done.stdout
    assert "done" in done.stdout  # wait's line and status --all's row


def test_the_first_command_fails_when_a_step_fails(home: dict[str, str], tmp_path: Path) -> None:
    assert _bash(_first_command(), home, tmp_path).returncode == 0
    again = _bash(_first_command(), home, tmp_path)  # the daemon already answers there
    assert again.returncode != 0
    assert "already answers" in again.stderr, again.stderr


def test_detach_returns_once_the_daemon_answers(home: dict[str, str], tmp_path: Path) -> None:
    done = _bash("gpusched daemon --simulate 1x24G --detach", home, tmp_path)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    assert Client(tmp_path / "gpusched.sock").ping()["pid"] == pid  # no wait: it answers
    assert (tmp_path / "state" / "daemon.log").exists()


def test_detach_says_why_the_daemon_did_not_start(home: dict[str, str], tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 120) / "gpusched.sock"  # past a Unix socket's 108 bytes
    done = _bash(f"gpusched --socket {too_long} daemon --simulate 1x24G --detach", home, tmp_path)
    assert done.returncode != 0
    assert "cannot listen there" in done.stderr, done.stderr
    assert "daemon.log" in done.stderr
