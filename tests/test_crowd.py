"""Short versions of the crowd and churn benchmarks (benchmarks/crowd.py, churn.py),
holding their outcomes, not their times: 50 clients submitting and reading for 15 s are
never refused nor met with an internal error, and every end of a ~30 s churn of short
jobs is recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.crowd_load import churn, crowd


def test_fifty_clients_for_15_s_are_all_served(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory().start()
    seen = crowd(daemon.socket_path, clients=50, seconds=15, cwd=tmp_path)
    assert seen.requests > 50
    assert seen.internal == []
    assert seen.refused == []


def test_every_end_of_a_churn_is_recorded(daemon_factory: Any, tmp_path: Path) -> None:
    daemon = daemon_factory().start()
    seen = churn(daemon.socket_path, seconds=30, cwd=tmp_path)
    assert seen.jobs > 8
    assert seen.unrecorded == []
    assert len(seen.lags_s) == seen.jobs
