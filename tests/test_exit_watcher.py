"""The exit watcher: every watched process's end is reported once, from its own thread."""

from __future__ import annotations

import subprocess
import threading

from gpusched.processes.exit_watcher import ExitWatcher
from gpusched.processes.pidref import process_start_time
from tests.daemon_harness import eventually


def test_each_end_is_reported_once_from_the_watcher_thread() -> None:
    reports: list[tuple[int, str]] = []
    watcher = ExitWatcher(
        lambda ids: reports.extend((i, threading.current_thread().name) for i in ids)
    )
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()  # reaped: no process left to open a pidfd on
        watcher.watch(1, gone.pid)
        running = subprocess.Popen(["sleep", "0.3"])
        watcher.watch(2, running.pid, process_start_time(running.pid))
        eventually(lambda: len(reports) == 2, describe=lambda: reports)
        running.wait()
        assert sorted(reports) == [(1, "job-watcher"), (2, "job-watcher")]
    finally:
        watcher.close()


def test_a_failing_callback_does_not_stop_the_watcher() -> None:
    reports: list[int] = []

    def on_exits(ids: list[int]) -> None:
        reports.extend(ids)
        if ids == [1]:
            raise RuntimeError("a bug in whoever settles the end")

    watcher = ExitWatcher(on_exits)
    try:
        for job_id in (1, 2):
            process = subprocess.Popen(["true"])
            watcher.watch(job_id, process.pid)
            eventually(lambda: reports[-1:] == [job_id], describe=lambda: reports)  # noqa: B023
            process.wait()
        assert reports == [1, 2]
    finally:
        watcher.close()
