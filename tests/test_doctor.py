"""`gpusched doctor` on a healthy simulated daemon, without one, and on the fake NVML driver."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpusched.processes import device_program
from tests.daemon_harness import RunningDaemon
from tests.fakenvml.fixtures import FakeNvml


def _statuses(stdout: str) -> dict[str, str]:
    """{check name: ok|warn|FAIL|skip} from doctor's lines."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("ok", "warn", "FAIL", "skip"):
            found[words[1]] = words[0]
    return found


def test_doctor_passes_on_a_healthy_simulated_daemon(daemon: RunningDaemon) -> None:
    result = daemon.cli("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    statuses = _statuses(result.stdout)
    for check in ("config", "gpus", "daemon", "state_dir", "log_dir", "database"):
        assert statuses[check] == "ok", result.stdout
    assert statuses["systemd"] in ("ok", "warn", "skip")  # a test daemon is not the service
    assert daemon.process is not None
    assert f"daemon pid {daemon.process.pid} (version " in result.stdout
    assert f"answers at {daemon.socket_path}" in result.stdout
    assert result.stdout.rstrip().endswith("all checks passed")
    report = json.loads(daemon.cli("doctor", "--json").stdout)
    assert report["ok"] is True
    assert {c["name"] for c in report["checks"]} >= {"config", "gpus", "daemon", "systemd"}


def test_doctor_without_a_daemon_fails_and_says_how_to_start_it(daemon_factory: Any) -> None:
    daemon = daemon_factory()  # configured, never started: no socket
    result = daemon.cli("doctor")
    assert result.returncode == 1
    assert _statuses(result.stdout)["daemon"] == "FAIL"
    assert str(daemon.socket_path) in result.stdout
    assert "fix: start it: sudo systemctl start gpusched" in result.stdout
    assert "check(s) failed" in result.stdout
    report = json.loads(daemon.cli("doctor", "--json").stdout)
    assert report["ok"] is False
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["daemon"]
    assert failed[0]["fix"]


def test_doctor_names_a_bad_config_key(daemon_factory: Any) -> None:
    daemon = daemon_factory(config={"headroom": "lots"})
    result = daemon.cli("doctor")
    assert result.returncode == 1
    assert _statuses(result.stdout)["config"] == "FAIL"
    assert "key 'headroom'" in result.stdout


def test_doctor_reads_the_driver_through_nvml(daemon_factory: Any, fake_nvml: FakeNvml) -> None:
    daemon = daemon_factory(simulate=None, env=fake_nvml.env())
    result = daemon.cli("doctor")
    assert _statuses(result.stdout)["gpus"] == "ok", result.stdout
    assert "NVIDIA driver" in result.stdout
    fake_nvml.set_driver(loaded=False)
    result = daemon.cli("doctor")
    assert _statuses(result.stdout)["gpus"] == "FAIL"
    assert "driver is not loaded" in result.stdout
    assert result.returncode == 1


def test_doctor_says_whether_a_job_is_kept_off_the_other_cards(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    v1 = Path("/sys/fs/cgroup/devices").is_dir()
    fenced = v1 or device_program.unavailable() is None  # v2: by a BPF device program
    daemon = daemon_factory(simulate=None, env=fake_nvml.env())
    result = daemon.cli("doctor")
    assert _statuses(result.stdout)["devices"] == ("ok" if fenced else "warn"), result.stdout
    said = "each job can open only its own GPUs" if fenced else "a job's GPUs are not fenced"
    assert said in result.stdout
    assert ("cgroup v1 devices controller" if v1 else "cgroup v2") in result.stdout
    simulated = daemon_factory()
    assert _statuses(simulated.cli("doctor").stdout)["devices"] == "skip"


def test_doctor_says_whether_ram_and_cpus_would_be_held(daemon: RunningDaemon) -> None:
    from gpusched.processes.cgroups import own_memory_cgroup
    from gpusched.processes.cpusets import unavailable

    held = os.geteuid() == 0 and own_memory_cgroup() is not None and unavailable() is None
    result = daemon.cli("doctor")
    assert _statuses(result.stdout)["host"] == ("ok" if held else "warn"), result.stdout
    said = "holds a job to its --ram and --cpus" if held else "--ram and --cpus are refused"
    assert said in result.stdout


def test_a_daemon_started_before_the_code_changed_is_a_warning(daemon: RunningDaemon) -> None:
    """An upgrade that kept the version number (or an edit of an editable install): the
    daemon still runs the code it loaded, so doctor says restart, not ok."""
    import os
    import time

    import gpusched

    assert _statuses(daemon.cli("doctor").stdout)["daemon"] == "ok"
    init = Path(gpusched.__file__)
    before = init.stat()
    later = time.time() + 5
    os.utime(init, (later, later))  # as if just installed; the content stays
    try:
        result = daemon.cli("doctor")
    finally:
        os.utime(init, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _statuses(result.stdout)["daemon"] == "warn", result.stdout
    assert "it runs older code" in result.stdout
    assert "fix: restart the daemon" in result.stdout


def test_doctor_run_by_a_user_checks_the_config_of_the_service_their_client_uses() -> None:
    """A user whose client talks to the system service (one is installed: its socket's
    directory exists, gpusched.daemon_socket) gets the service's config checked, not the
    defaults of a personal daemon they do not run."""
    import shutil
    import tempfile

    from gpusched.cli.doctor import run_checks
    from tests.users import as_user, throwaway_users

    root = Path(tempfile.mkdtemp(prefix="gpusched-doctor-", dir="/tmp"))
    try:
        root.chmod(0o755)
        system_config = root / "config.yaml"
        system_config.write_text("headroom: 1G\nsimulate: 2x24G\n")
        system_config.chmod(0o644)
        (root / "run").mkdir(mode=0o755)  # the service's socket directory: it is installed
        with throwaway_users(1) as ([alice], _group):

            def check() -> list[dict[str, Any]]:
                import os

                os.environ.pop("GPUSCHED_SOCKET", None)
                os.environ.pop("GPUSCHED_CONFIG", None)
                os.environ["XDG_RUNTIME_DIR"] = str(root / "no-runtime-dir")
                os.environ["GPUSCHED_SYSTEM_SOCKET"] = str(root / "run" / "gpusched.sock")
                return [c.to_json() for c in run_checks(system_config=system_config)]

            checks = {c["name"]: c for c in as_user(alice, check)}
        assert checks["config"]["status"] == "ok", checks["config"]
        assert str(system_config) in checks["config"]["message"]
        assert "the system service's" in checks["config"]["message"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
