"""Notification hooks (`submit --notify`, `on_finish:`): as the owner, JSON on stdin, bounded."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from gpusched.client import Client
from gpusched.config.settings import load_config
from gpusched.core.errors import UsageError
from gpusched.daemon.hookrun import HookResultKind
from gpusched.daemon.hooks import run_hook
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import as_user, throwaway_users

# Writes who it runs as, where, the job's variables and (last line) the JSON it was given.
REPORT = (
    'exec > "$HOME/hook.out"; id -u; id -g; id -G; pwd;'
    ' echo "$GPUSCHED_JOB_ID $GPUSCHED_JOB_STATE $GPUSCHED_EXIT_CODE"; cat'
)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A daemon directory every user can traverse (pytest's tmp dirs are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-hooks-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_notify_hook_runs_as_the_owner_with_the_job_json_on_stdin(shared_root: Path) -> None:
    with throwaway_users(1) as ([alice], _group):
        daemon = RunningDaemon(shared_root).start()
        try:
            socket_path = daemon.socket_path
            notify = f"sh -c '{REPORT}'"  # one string, split like a shell would: never run by one
            job = as_user(
                alice,
                lambda: (
                    Client(socket_path)
                    .submit(["sh", "-c", "exit 3"], mem="1G", notify=notify)
                    .to_json()
                ),
            )
            report = Path(alice.home) / "hook.out"
            eventually(lambda: report.exists() and report.read_text().endswith("}\n"), timeout=15)
            lines = report.read_text().splitlines()
            assert int(lines[0]) == alice.uid
            assert int(lines[1]) == alice.gid
            assert sorted(map(int, lines[2].split())) == sorted(set(alice.groups()))
            assert lines[3] == alice.home  # the job's working directory
            assert lines[4] == f"{job['id']} failed 3"
            seen = json.loads(lines[5])
            assert (seen["id"], seen["user"], seen["state"]) == (job["id"], alice.name, "failed")
            assert (seen["exit_code"], seen["reason"]) == (3, "exit")
            assert os.stat(report).st_uid == alice.uid
        finally:
            daemon.stop()
            daemon.kill_jobs()


def test_a_hanging_hook_is_killed_after_the_timeout_and_scheduling_goes_on(
    daemon_factory: Any, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    daemon = daemon_factory(
        config={
            "hook_timeout": "3s",
            # The administrator's hook: every job, as its owner, JSON on stdin.
            "on_finish": ["sh", "-c", f'cat > "{marks}/on_finish-$GPUSCHED_JOB_ID.json"'],
        }
    ).start()
    # A hook that never ends, with a child in its process group.
    hang = f"sh -c 'sleep 60 & echo $! > {marks}/child.pid; echo $$ > {marks}/hook.pid; wait'"
    first = daemon.submit("--mem", "1G", "--notify", hang, "--", "true")
    hook_pid = int(
        eventually(lambda: (p := marks / "hook.pid").exists() and p.read_text(), timeout=15)
    )
    child_pid = int(
        eventually(lambda: (p := marks / "child.pid").exists() and p.read_text(), timeout=15)
    )
    assert psutil.pid_exists(hook_pid)
    # While the hook hangs, the daemon answers and runs the next job to its end.
    second = daemon.submit("--mem", "1G", "--", "true")
    assert daemon.wait_state(second, {"done"}, timeout=10)["state"] == "done"
    assert psutil.pid_exists(hook_pid), "the second job should have run while the hook hung"
    # Then the timeout kills the hook's whole process group, and says so in the log.
    eventually(lambda: not _alive(hook_pid) and not _alive(child_pid), timeout=10)
    eventually(lambda: "still running after 3s: killed" in daemon.stderr(), timeout=15)
    for job_id in (first, second):
        text = eventually(functools.partial(_read, marks / f"on_finish-{job_id}.json"), timeout=15)
        assert text is not None
        seen = json.loads(text)
        assert (seen["id"], seen["state"]) == (job_id, "done")


def test_hooks_not_started_when_the_daemon_stops_run_once_at_its_next_start(
    daemon_factory: Any, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    running = 4  # all the jobs are one user's: their hooks_per_user run at once
    daemon = daemon_factory(config={"hooks_per_user": running}).start()
    client = daemon.client()
    # Each hook takes a while, so at the stop `running` of them are running and the
    # rest are still waiting for their turn.
    hook = f"sh -c 'sleep 2; echo $GPUSCHED_JOB_ID >> {ran}'"
    ids = [
        client.submit(["true"], mem="1G", cwd=tmp_path, notify=hook).id for _ in range(running + 2)
    ]
    assert {job.state for job in client.wait(ids, timeout=20)} == {"done"}
    assert daemon.stop() == 0  # SIGTERM: the running hooks finish, the daemon exits

    def lines() -> list[int]:
        return [int(x) for x in ran.read_text().split()] if ran.exists() else []

    before = lines()
    assert len(before) == running, before
    daemon.start()
    eventually(lambda: len(lines()) >= len(ids), timeout=20)
    time.sleep(1.0)  # a hook started twice would have written by now (sleep 2 minus the wait)
    assert sorted(lines()) == sorted(ids), "each job's hook runs exactly once"
    assert "running the notification hooks of 2 job(s) that ended before" in daemon.stderr()
    # `show` says what runs at the end.
    shown = daemon.cli("show", str(ids[0])).stdout
    assert f"notify:    sh -c 'sleep 2; echo $GPUSCHED_JOB_ID >> {ran}'" in shown


def _read(path: Path) -> str | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return text if text.endswith("\n") else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_run_hook_reports_failures_without_raising(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "cwd": str(tmp_path),
        "uid": os.geteuid(),
        "gid": os.getegid(),
        "umask": 0o022,
        "timeout_s": 5.0,
        "output_path": tmp_path / "hook.out",
        "output_max_bytes": 4096,
    }
    failed = run_hook(["sh", "-c", "echo oops >&2; exit 4"], {"id": 1}, **common)
    assert (failed.kind, failed.exit_code, failed.output) == (HookResultKind.EXIT, 4, "oops")
    # Looked up as the owner (by the runner's exec, never by root): a missing command is
    # the shell's "not found", exit 127.
    missing = run_hook(["/nonexistent/hook"], {"id": 1}, **common)
    assert (missing.kind, missing.exit_code) == (HookResultKind.EXIT, 127)
    assert "/nonexistent/hook: not found" in missing.output
    # A hook that never reads its stdin does not block on a large job JSON.
    quiet = run_hook(["true"], {"blob": "x" * 1_000_000}, **common)
    assert (quiet.kind, quiet.exit_code) == (HookResultKind.EXIT, 0)
    # Output past hook_output_max is cut (the pipe closed), never stored in full.
    chatty = run_hook(["sh", "-c", "yes hello; echo after >&2"], {"id": 1}, **common)
    assert chatty.cut
    assert chatty.exit_code != 0  # `yes`, then the shell, died of SIGPIPE at the cut
    assert set(chatty.output.splitlines()[1:-1]) == {"hello"}  # nothing after the cut
    assert not (tmp_path / "hook.out").exists()  # removed once the hook has ended


def test_run_hook_says_how_the_hook_ended_as_a_kind(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "cwd": str(tmp_path),
        "uid": os.geteuid(),
        "gid": os.getegid(),
        "umask": 0o022,
        "output_max_bytes": 4096,
    }
    out = tmp_path / "hook.out"
    ran = run_hook(["true"], {"id": 1}, timeout_s=5.0, output_path=out, **common)
    assert ran.kind is HookResultKind.EXIT
    hung = run_hook(["sleep", "60"], {"id": 1}, timeout_s=0.5, output_path=out, **common)
    assert hung.kind is HookResultKind.TIMEOUT
    # Its output file cannot be created (its directory would be under a plain file).
    (tmp_path / "plain").write_text("")
    nowhere = tmp_path / "plain" / "hook.out"
    unborn = run_hook(["true"], {"id": 1}, timeout_s=5.0, output_path=nowhere, **common)
    assert unborn.kind is HookResultKind.FAILED_TO_START
    assert "cannot create" in unborn.output
    # Enum members, not bare words that happen to compare equal.
    assert all(isinstance(r.kind, HookResultKind) for r in (ran, hung, unborn))
    # Each prints (and compares) as the word the daemon's log has always used.
    assert [str(k) for k in HookResultKind] == ["exit", "timeout", "failed_to_start"]


def test_hook_config_keys_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("on_finish: notify-send 'job done'\nhook_timeout: 10s\n")
    config = load_config(path)
    assert config.on_finish == ("notify-send", "job done")
    assert config.hook_timeout_s == 10.0
    assert load_config(None).hook_timeout_s == 30.0
    shipped = Path(__file__).resolve().parents[1] / "config" / "gpusched.yaml"
    documented = yaml.safe_load(shipped.read_text())
    assert {"on_finish", "hook_timeout", "metrics"} <= set(documented)
    assert load_config(shipped).hook_timeout_s == 30.0
    assert {"hooks_per_user", "hooks_total", "hook_output_max"} <= set(documented)
    defaults = load_config(None)
    assert (defaults.hooks_per_user, defaults.hooks_total) == (2, 8)
    assert defaults.hook_output_max_bytes == 64 * 1024
    path.write_text("hooks_per_user: 1\nhooks_total: 3\nhook_output_max: 1M\n")
    tuned = load_config(path)
    assert (tuned.hooks_per_user, tuned.hooks_total, tuned.hook_output_max_bytes) == (1, 3, 2**20)
    for bad in ("hooks_per_user: 0", "hooks_total: many", "hook_output_max: -1K"):
        path.write_text(bad + "\n")
        with pytest.raises(UsageError, match=bad.split(":")[0]):
            load_config(path)
    path.write_text("on_finish: [1, 2]\n")
    with pytest.raises(UsageError, match="on_finish"):
        load_config(path)
    path.write_text('on_finish: "sh -c \'unclosed"\n')
    with pytest.raises(UsageError, match="on_finish"):
        load_config(path)


def test_how_a_notify_hook_ended_is_recorded_on_the_job_for_its_owner(
    daemon: RunningDaemon,
) -> None:
    """Stock Debian has no `mail`: a failing hook's exit status and last words are in
    `show` (and its JSON), not only in root's journal; a long output keeps its end."""
    missing = daemon.submit("--mem", "1G", "--notify", "no-such-mailer -s done", "--", "true")
    result = eventually(lambda: daemon.show(missing)["notify_result"], timeout=20)
    assert result["kind"] == "failed_to_start" or result["exit_code"] not in (0, None)
    shouted = "python3 -c \"import sys; print('x' * 5000); print('oops'); sys.exit(4)\""
    loud = daemon.submit("--mem", "1G", "--notify", shouted, "--", "true")
    result = eventually(lambda: daemon.show(loud)["notify_result"], timeout=20)
    assert (result["kind"], result["exit_code"]) == ("exit", 4)
    assert result["output"].endswith("oops") and len(result["output"]) <= 500
    shown = daemon.cli("show", str(loud))
    assert "notify ran: exited 4: " in shown.stdout
    assert "oops" in shown.stdout
    quiet = daemon.submit("--mem", "1G", "--", "true")
    daemon.wait_state(quiet, {"done"})
    assert daemon.show(quiet)["notify_result"] is None
