"""--config and --socket are accepted before or after the command's name, on every command.

`gpusched daemon --config /etc/gpusched/config.yaml` is how people type it (and how a
systemd unit is often written); it was "No such option" while only the group took it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpusched.cli import cli
from tests.daemon_harness import RunningDaemon


def test_every_command_takes_config_and_socket_after_its_name() -> None:
    ctx = cli.make_context("gpusched", ["--help"], resilient_parsing=True)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None, name
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert {"--config", "--socket"} <= options, name


def test_daemon_config_and_socket_given_after_the_command(tmp_path: Path) -> None:
    daemon = RunningDaemon(tmp_path)
    daemon.env.pop("GPUSCHED_CONFIG")  # only the command line names the config
    daemon.start("--config", str(daemon.config_path))
    try:
        env = {k: v for k, v in daemon.env.items() if not k.startswith("GPUSCHED_")}
        sock, nowhere = str(daemon.socket_path), str(tmp_path / "nowhere")
        after = daemon.cli("status", "--json", "--socket", sock, env=env)
        assert after.returncode == 0, after.stderr
        # Given twice, the one after the command's name wins.
        both = daemon.cli(
            "--socket", str(tmp_path / "nowhere"), "status", "--socket", sock, env=env
        )
        assert both.returncode == 0, both.stderr
        job = daemon.cli("submit", "--config", str(daemon.config_path), "--", "true", env=env)
        assert job.returncode == 0, job.stderr
        wrong = daemon.cli("status", "--socket", nowhere, env=env)
        assert wrong.returncode == 3
        assert nowhere in wrong.stderr
    finally:
        daemon.stop()


def test_a_missing_config_after_the_command_is_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon", "--config", "/nonexistent/gpusched.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "/nonexistent/gpusched.yaml" in result.stderr
