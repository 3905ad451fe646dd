"""`gpusched daemon --detach`: the daemon started in the background, the command
returning once it answers on its socket (as `pueued -d` does), so that the next command
of a script finds it however slowly it starts.

The daemon is the same `gpusched daemon` in a process of its own session (no terminal's
Ctrl-C or hang-up reaches it), its stderr appended to `daemon.log` in its state
directory. Should it exit before it answers, what it said there is printed and the
command exits non-zero; one that lives and never answers within DETACH_WAIT_S is stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click

from gpusched.client import Client
from gpusched.core.errors import EXIT_FAILED, GpuschedError, UsageError
from gpusched.core.sanitize import shown

# A daemon that lives this long without answering is stuck, not slow: on a loaded 2-core
# machine one answers within some 10 s.
DETACH_WAIT_S = 120.0
LOG_NAME = "daemon.log"


def start_detached(config: str | None, simulate: str | None, socket: str | None) -> int:
    """Start the daemon in the background; its pid on stdout once it answers. The exit
    code: 0 once it answers, else non-zero with the daemon's own error on stderr."""
    from gpusched.config.settings import load_config

    overrides = {"simulate": simulate} if simulate else {}
    if socket:
        overrides["socket"] = os.path.abspath(socket)
    settings = load_config(Path(config) if config else None, overrides)
    where = settings.socket_path
    running = _pid_answering(where)
    if running is not None:
        raise UsageError(f"a gpusched daemon (pid {running}) already answers at {where}")
    log_path = settings.state_dir / LOG_NAME
    try:
        settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - the daemon's stderr, kept past this process
    except OSError as exc:
        raise GpuschedError(f"cannot write the daemon's log {log_path}: {exc.strerror}") from None
    start = log.tell()
    argv = [sys.executable, "-m", "gpusched"]
    argv += ["--config", config] if config else []
    argv += ["--socket", os.path.abspath(socket)] if socket else []
    argv += ["daemon", *(["--simulate", simulate] if simulate else [])]
    with log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return _until_answering(process, where, log_path, start)


def _until_answering(
    process: subprocess.Popen[bytes], where: Path, log_path: Path, start: int
) -> int:
    deadline = time.monotonic() + DETACH_WAIT_S
    while True:
        code = process.poll()
        if code is not None:
            said = _said_since(log_path, start) or f"the daemon exited {code}"
            click.echo(f"{said}\n(the daemon's log: {log_path})", err=True)
            return code or EXIT_FAILED
        pid = _pid_answering(where)
        if pid is not None:
            click.echo(pid)
            click.echo(
                f"gpusched: daemon {pid} answering at {where} (log: {log_path}; stop it with"
                f" `kill {pid}`)",
                err=True,
            )
            process.returncode = 0  # it lives on, on its own: not this process's to reap
            return 0
        if time.monotonic() > deadline:
            process.terminate()
            raise GpuschedError(
                f"the daemon (pid {process.pid}) did not answer at {where} within"
                f" {DETACH_WAIT_S:g}s: stopped it; its log: {log_path}"
            )
        time.sleep(0.1)


def _pid_answering(where: Path) -> int | None:
    """The pid of the daemon answering a ping at `where`, or None."""
    if not where.exists():
        return None
    try:
        return int(Client(where, timeout_s=5.0).ping()["pid"])
    except GpuschedError:
        return None


def _said_since(log_path: Path, start: int) -> str:
    """What the daemon wrote to its log since `start`: its last lines, escaped."""
    try:
        with open(log_path, "rb") as log:
            log.seek(start)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [shown(line) for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-5:])
