"""`--ram` and `--cpus`: what a job asks of the server itself, carried by the submit
request, stored on the job, given back in its JSON and printed by `show`, through
`handlers.dispatch` as tests/test_handlers.py does; bad values refused in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.cli.show_view import show_lines
from gpusched.cli.submit_view import job_options
from gpusched.core.errors import UsageError
from tests.fakes import GiB
from tests.test_handlers import ROOT, VALID, Daemon
from tests.world import make_world


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    world = make_world(tmp_path, [24 * GiB, 24 * GiB])
    yield Daemon(world)
    world.scheduler.store.close()


def test_ram_and_cpus_are_stored_and_shown(daemon: Daemon) -> None:
    job = daemon.ask(ROOT, "submit", **VALID, ram=3 * GiB, cpus=1)
    assert (job["ram"], job["cpus"]) == (3 * GiB, 1)
    shown = daemon.ask(ROOT, "show", id=job["id"])
    assert (shown["ram"], shown["cpus"]) == (3 * GiB, 1)
    lines = show_lines(shown, 100)
    assert any(line.startswith("ram") and "3G of host memory" in line for line in lines)
    assert any(line.startswith("cpus") and "1 core(s) of its own" in line for line in lines)
    plain = daemon.ask(ROOT, "submit", **VALID)
    assert (plain["ram"], plain["cpus"]) == (None, None)
    assert not any(line.startswith(("ram", "cpus")) for line in show_lines(plain, 100))


@pytest.mark.parametrize(
    ("ask", "message"),
    [
        ({"ram": 1024}, "--ram 1024 bytes: at least 64M"),
        ({"ram": 0}, "--ram 0 bytes: at least 64M"),
        ({"cpus": 0}, "--cpus 0: expected a number of cores from 1 to 4096"),
        ({"cpus": 10**6}, "--cpus 1000000: expected a number of cores"),
    ],
)
def test_impossible_values_are_refused_in_one_line(
    daemon: Daemon, ask: dict[str, int], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as refused:
        daemon.ask(ROOT, "submit", **VALID, **ask)
    assert "\n" not in str(refused.value)
    assert daemon.ask(ROOT, "status", all=True)["jobs"] == []


@pytest.mark.parametrize(
    ("ram", "message"),
    [("24", "--ram 24: add a unit, e.g. 24G"), ("1M", "--ram 1M: at least 64M"), ("x", "--ram x")],
)
def test_the_command_line_refuses_a_bad_size(ram: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        job_options(ram=ram)
    assert job_options(ram="24G", cpus=4)["ram"] == 24 * GiB
