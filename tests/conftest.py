"""Shared pytest fixtures.

The fake NVML driver's fixtures live in tests/fakenvml/fixtures.py (see its docstring);
they are imported here so every test module can use them by name.
"""

# -- a real daemon on simulated GPUs, in a temporary directory ---------------------------
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon
from tests.fakenvml.fixtures import (  # noqa: F401
    fake_nvml,
    fake_nvml_builds,
    fake_nvml_inproc,
    fake_nvml_no_v2,
    fake_nvml_old,
)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Any]:
    """Make (and always stop) daemons: daemon_factory(simulate="2x24G", config={...})."""
    started: list[RunningDaemon] = []

    def make(name: str = "d", **kwargs: Any) -> RunningDaemon:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        daemon = RunningDaemon(root, **kwargs)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()
        daemon.kill_jobs()


@pytest.fixture
def daemon(daemon_factory: Any) -> RunningDaemon:
    """A started daemon with two simulated 24G GPUs."""
    return daemon_factory().start()
