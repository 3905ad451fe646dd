"""The launcher's watcher: when and from where it reports a supervisor's exit."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from gpusched.launcher import Launcher


def test_an_exit_is_reported_from_the_watcher_thread_even_when_already_gone(
    tmp_path: Path,
) -> None:
    # The daemon starts a scheduling pass from the exit callback; called inline by
    # watch() (which a pass itself calls), that pass would run inside the first one.
    reports: list[tuple[int, str, bool]] = []
    reported = threading.Event()
    watch_returned = threading.Event()

    def on_exit(job_id: int) -> None:
        reports.append((job_id, threading.current_thread().name, watch_returned.is_set()))
        reported.set()

    launcher = Launcher(tmp_path / "state", tmp_path / "logs", 1.0, on_exit)
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()  # reaped: pidfd_open finds no such process
        launcher.watch(7, gone.pid)
        watch_returned.set()
        assert reported.wait(10)
        reported.clear()
        running = subprocess.Popen(["sleep", "0.2"])
        launcher.watch(8, running.pid)
        assert reported.wait(10)
        running.wait()
    finally:
        launcher.close()
    assert reports == [(7, "job-watcher", True), (8, "job-watcher", True)]
