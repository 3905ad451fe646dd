"""`gpusched admin prune`: old ended jobs forgotten with their logs, timelines and job
directories, on an administrator's demand; the real daemon, the real CLI."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.client import Client
from gpusched.core.errors import NotFoundError, PermissionDenied
from tests.daemon_harness import RunningDaemon
from tests.users import as_user, throwaway_users


def test_prune_forgets_old_ended_jobs_and_their_files_but_not_what_a_job_waits_for(
    daemon: RunningDaemon,
) -> None:
    ended = [daemon.submit("--mem", "1G", "--", "echo", "hello") for _ in range(3)]
    for job_id in ended:
        daemon.wait_state(job_id, {"done"})
    waited_for = ended[0]
    dependent = daemon.submit("--hold", "--after", str(waited_for), "--mem", "1G", "--", "true")
    logs = {job_id: Path(daemon.show(job_id)["log_path"]) for job_id in ended}
    assert all(path.exists() for path in logs.values())
    jobs_dir = daemon.root / "state" / "jobs"

    recent = daemon.cli("admin", "prune", "--ended-before", "1h")
    assert recent.returncode == 0, recent.stderr
    assert recent.stdout.startswith("forgot 0 job(s) ended before ")

    dry = daemon.cli("admin", "prune", "--ended-before", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would forget 2 job(s)")
    assert all(path.exists() for path in logs.values())

    done = daemon.cli("admin", "prune", "--ended-before", "0s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("forgot 2 job(s)")
    for job_id in ended[1:]:
        with pytest.raises(NotFoundError):
            daemon.client().job(job_id)
        assert not logs[job_id].exists()
        assert not (jobs_dir / str(job_id)).exists()
    assert daemon.show(waited_for)["state"] == "done"  # job `dependent` waits for it
    assert logs[waited_for].exists()
    assert daemon.show(dependent)["state"] == "held"
    assert daemon.cli("admin", "prune", "--ended-before", "soon").returncode == 2


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A daemon directory every user can traverse (pytest's tmp dirs are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-prune-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_only_an_administrator_may_prune(shared_root: Path) -> None:
    with throwaway_users(1) as ([alice], _group):
        daemon = RunningDaemon(shared_root).start()
        try:
            socket_path = daemon.socket_path
            with pytest.raises(PermissionDenied, match="only an administrator"):
                as_user(alice, lambda: Client(socket_path).prune(0.0))
        finally:
            daemon.stop()


def test_admin_reload_reports_a_rejected_config_and_applies_a_good_one(
    daemon: RunningDaemon,
) -> None:
    """What systemd's ExecReload runs: it waits for the daemon's answer, so a bad file is
    an error there (not only a line in the journal) and the old config stays in force."""
    import yaml

    good = yaml.safe_load(daemon.config_path.read_text())
    daemon.config_path.write_text(yaml.safe_dump({**good, "headroom": "lots"}))
    refused = daemon.cli("admin", "reload")
    assert refused.returncode != 0
    assert "key 'headroom'" in refused.stderr
    assert daemon.client().ping()  # still serving, on the old config
    moved = {**good, "headroom": "1G", "socket": str(daemon.root / "elsewhere.sock")}
    daemon.config_path.write_text(yaml.safe_dump(moved))
    applied = daemon.cli("--socket", str(daemon.socket_path), "admin", "reload")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == "config reloaded"
    assert "socket_path needs a restart to change: kept" in applied.stderr


def test_admins_may_be_named_by_unix_group(shared_root: Path) -> None:
    """`admins: ["@group"]`: the group's members administer (prune here), from the account
    database; a user outside it is refused."""
    with throwaway_users(2, extra_group=True) as ([alice, bob], group):
        assert group is not None
        subprocess.run(["gpasswd", "-d", bob.name, group], check=True, capture_output=True)
        daemon = RunningDaemon(shared_root, config={"admins": [f"@{group}"]}).start()
        try:
            socket_path = daemon.socket_path
            done = as_user(alice, lambda: Client(socket_path).prune(86400.0, dry_run=True))
            assert done["jobs"] == 0
            with pytest.raises(PermissionDenied, match="only an administrator"):
                as_user(bob, lambda: Client(socket_path).prune(86400.0, dry_run=True))
        finally:
            daemon.stop()
