"""The shipped systemd unit: it verifies, and keeps the settings gpusched relies on."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "gpusched.service"


def _settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_keeps_jobs_alive_and_notifies_readiness() -> None:
    settings = _settings()
    assert settings["Type"] == ["notify"]
    assert settings["KillMode"] == ["process"]  # a restart must not kill running jobs
    assert settings["Restart"] == ["on-failure"]
    assert settings["RuntimeDirectoryPreserve"] == ["yes"]
    assert "gpusched daemon --config /etc/gpusched/config.yaml" in settings["ExecStart"][0]
    # A reload that waits for the daemon's answer, so a rejected config fails it.
    assert settings["ExecReload"][0].endswith("--socket /run/gpusched/gpusched.sock admin reload")
    # gpusched's own docs, where scripts/install.sh puts them.
    assert settings["Documentation"] == ["file:/opt/gpusched/share/doc/gpusched/operations.md"]
    for key in ("StateDirectory", "LogsDirectory", "RuntimeDirectory"):
        assert key in settings
    # Jobs inherit the sandbox: nothing that would cut them off from GPUs, network or homes.
    for forbidden in (
        "PrivateDevices",
        "ProtectHome",
        "NoNewPrivileges",
        "RestrictAddressFamilies",
        "PrivateNetwork",
        "DevicePolicy",
    ):
        assert forbidden not in settings, forbidden


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    gpusched = shutil.which("gpusched")
    if analyze is None or gpusched is None:
        pytest.skip("systemd-analyze or the gpusched console script is not installed")
    # verify checks that ExecStart exists: point it at this installation's gpusched.
    unit = tmp_path / "gpusched.service"
    unit.write_text(UNIT.read_text().replace("/opt/gpusched/bin/gpusched", gpusched))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "gpusched.service" not in result.stderr, result.stderr


def test_daemon_tells_systemd_it_is_ready_once_the_socket_listens(
    daemon_factory: Any, tmp_path: Path
) -> None:
    notify_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(notify_path))
        listener.settimeout(20)
        daemon = daemon_factory(env={"NOTIFY_SOCKET": str(notify_path)})
        daemon.start()
        message = listener.recv(4096).decode()
        assert "READY=1" in message.splitlines()
        assert daemon.client().ping()["version"]
        daemon.stop()
        assert "STOPPING=1" in listener.recv(4096).decode().splitlines()
