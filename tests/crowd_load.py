"""Load for a running daemon, shared by the crowd and churn benchmarks
(benchmarks/crowd.py, benchmarks/churn.py) and their short versions in the suite
(tests/test_crowd.py): many clients submitting and reading at once, and a stream of
short jobs whose ends must be recorded soon after their supervisors exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gpusched.client import Client
from gpusched.core.errors import GpuschedError
from gpusched.core.models import TERMINAL_STATES, Job


@dataclass
class CrowdOutcome:
    """What the crowd's requests met: each refusal's and internal error's message."""

    requests: int = 0
    refused: list[str] = field(default_factory=list)
    internal: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # each answered request's

    def percentile(self, fraction: float) -> float:
        ranked = sorted(self.seconds)
        return ranked[min(len(ranked) - 1, int(fraction * len(ranked)))] if ranked else 0.0


def crowd(socket_path: Path, clients: int, seconds: float, cwd: Path) -> CrowdOutcome:
    """`clients` threads, each submitting a held job then reading `status`, for `seconds`
    (held: the load is on the requests, not on starting processes)."""
    outcome = CrowdOutcome()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def one_client() -> None:
        client = Client(socket_path)
        while time.monotonic() < deadline:
            asks: tuple[Callable[[], object], ...] = (
                lambda: client.submit(["true"], mem="1G", hold=True, cwd=cwd),
                client.status,
            )
            for ask in asks:
                began = time.monotonic()
                try:
                    ask()
                    failure = None
                except GpuschedError as exc:
                    failure = exc.message
                with lock:
                    outcome.requests += 1
                    if failure is None:
                        outcome.seconds.append(time.monotonic() - began)
                    elif failure.startswith("internal error"):
                        outcome.internal.append(failure)
                    else:
                        outcome.refused.append(failure)

    threads = [threading.Thread(target=one_client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


@dataclass
class ChurnOutcome:
    jobs: int
    unrecorded: list[int]  # still not ended when the churn's wait ran out
    lags_s: list[float]  # per job: its recorded end after its supervisor's exit

    @property
    def largest_lag_s(self) -> float:
        return max(self.lags_s, default=0.0)


def churn(socket_path: Path, seconds: float, cwd: Path, in_flight: int = 8) -> ChurnOutcome:
    """Short jobs (`sleep 0.2`) kept `in_flight` at a time for `seconds`, then every one
    waited for (up to 60 s). A job's lag is its `ended_at` past `started_at + run_s` (its
    start as recorded, which precedes its command's exec, plus the run its supervisor
    measured): at least the time from its exit record to its recorded end."""
    client = Client(socket_path)
    submitted: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        active = [i for i in submitted[-4 * in_flight :] if _active(client.job(i))]
        for _ in range(in_flight - len(active)):
            submitted.append(client.submit(["sleep", "0.2"], mem="1G", cwd=cwd).id)
        time.sleep(0.2)
    ended = client.wait(submitted, timeout=60)
    unrecorded = [j.id for j in ended if j.state not in TERMINAL_STATES]
    lags = [lag for j in ended if (lag := _lag_s(j)) is not None]
    return ChurnOutcome(len(submitted), unrecorded, lags)


def _active(job: Job) -> bool:
    return job.state not in TERMINAL_STATES


def _lag_s(job: Job) -> float | None:
    if job.started_at is None or job.ended_at is None or job.run_s is None:
        return None
    started = datetime.fromisoformat(job.started_at.replace("Z", "+00:00"))
    ended = datetime.fromisoformat(job.ended_at.replace("Z", "+00:00"))
    return max(0.0, (ended - started).total_seconds() - job.run_s)
