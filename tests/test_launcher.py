"""The launcher's watcher: when and from where it reports a supervisor's exit."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import load_config
from gpusched.processes.launcher import Launcher
from tests.daemon_harness import directory_settings


def test_an_exit_is_reported_from_the_watcher_thread_even_when_already_gone(
    tmp_path: Path,
) -> None:
    # The exit callback settles the job's end; called inline by watch(), which the
    # scheduling pass that starts a job calls, it would settle an end in mid-pass.
    reports: list[tuple[int, str]] = []
    reported = threading.Event()

    def on_exit(job_id: int) -> None:
        reports.append((job_id, threading.current_thread().name))
        reported.set()

    config = load_config(None, directory_settings(tmp_path, None))
    launcher = Launcher(ConfigHolder(config))
    launcher.on_exit = on_exit
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()  # reaped: pidfd_open finds no such process
        launcher.watch(7, gone.pid)
        assert reported.wait(10)
        reported.clear()
        running = subprocess.Popen(["sleep", "0.2"])
        launcher.watch(8, running.pid)
        assert reported.wait(10)
        running.wait()
    finally:
        launcher.close()
    assert reports == [(7, "job-watcher"), (8, "job-watcher")]  # never the caller's thread
