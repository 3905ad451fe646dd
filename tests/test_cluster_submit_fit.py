"""A submit's fit check in a cluster (scheduling/submit_checks.py) refuses only on what
every candidate node has reported: a node that joined and has not yet sent its cards is
not read as a node of no GPUs. Two schedulers on one SQLite file (tests/world.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.errors import UsageError
from gpusched.core.models import JobState
from tests.fakes import FixedClock, GiB
from tests.world import World, make_node


def _a_reported_b_not(tmp_path: Path) -> tuple[World, World]:
    """Node a (one 24G card) has run a pass; node b (two) has joined, nothing more."""
    clock = FixedClock()
    a = make_node(tmp_path, "a", [24 * GiB], clock, pid=4000)
    b = make_node(tmp_path, "b", [24 * GiB, 24 * GiB], clock, pid=4001)
    a.tick()
    return a, b


def test_a_job_for_a_node_that_has_not_reported_waits_for_it(tmp_path: Path) -> None:
    a, b = _a_reported_b_not(tmp_path)
    job = a.submit(GiB, allowed_nodes=("b",))
    assert a.state(job) == JobState.QUEUED
    b.tick()
    a.tick()
    b.tick()
    assert a.state(job) == JobState.RUNNING


def test_more_gpus_than_reported_so_far_is_not_refused_on_a_guess(tmp_path: Path) -> None:
    a, b = _a_reported_b_not(tmp_path)
    job = a.submit(GiB, gpus=2)
    assert a.state(job) == JobState.QUEUED
    b.tick()
    with pytest.raises(UsageError, match="--gpus 3: the largest node has only 2 GPU"):
        a.submit(GiB, gpus=3)  # once every node has reported, refused as before


def test_a_named_node_too_small_is_named_in_the_refusal(tmp_path: Path) -> None:
    _a, b = _a_reported_b_not(tmp_path)
    b.tick()
    with pytest.raises(UsageError, match="--gpus 2: node a has only 1 GPU"):
        b.submit(GiB, gpus=2, allowed_nodes=("a",))
