"""`--ram` and `--cpus`: what a job asks of the server itself, carried by the submit
request, stored on the job, given back in its JSON and printed by `show`, through
`handlers.dispatch` as tests/test_handlers.py does; bad values refused in one line;
admitted by the host rule (a job waits while its server's memory or cores are taken);
refused where no cgroup could enforce them or where they could never fit; and the
limits each job is handed to its supervisor with."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.cli.show_view import show_lines
from gpusched.cli.submit_view import job_options
from gpusched.config.host import JOB_CPUS_ALL, HostSettings
from gpusched.config.settings import load_config
from gpusched.core.errors import ConfigError, UsageError
from gpusched.core.models import JobState
from gpusched.daemon.identity import Caller
from gpusched.processes.launching import HostFacts, Outcome, OutcomeKind
from tests.fakes import GiB
from tests.test_handlers import ALICE, ROOT, VALID, Daemon
from tests.world import make_world

# A server of 64G and 8 cores whose cgroups enforce both; with a reserve of 4G its jobs
# may reserve 60G in all.
ENFORCED = HostFacts(
    total_bytes=64 * GiB, cores=tuple(range(8)), gpu_count=2, no_memory=None, no_cpuset=None
)
RESERVE: dict[str, Any] = {"host": {"ram_reserve": "4G", "ram_reserve_min": 0}}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    world = make_world(tmp_path, [24 * GiB, 24 * GiB], **RESERVE)
    world.launcher.facts = ENFORCED
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


def test_a_job_waits_while_its_servers_memory_is_reserved(daemon: Daemon) -> None:
    world = daemon.world
    first, second, third = (
        daemon.ask(ALICE, "submit", **VALID, ram=24 * GiB)["id"] for _ in range(3)
    )
    world.tick()
    assert [world.state(j) for j in (first, second)] == [JobState.RUNNING] * 2
    waiting = world.job(third)
    assert waiting.state == JobState.QUEUED
    assert waiting.waiting_reason == "waits for host memory: 12G of 60G free, needs 24G"
    # A job that reserves no host memory is not held back by it (the cards have room).
    plain = daemon.ask(ALICE, "submit", **VALID)["id"]
    world.tick()
    assert world.state(plain) == JobState.RUNNING
    world.finish(first)
    world.tick()
    assert world.state(third) == JobState.RUNNING


def test_a_job_waits_while_its_servers_cores_are_reserved(daemon: Daemon) -> None:
    world = daemon.world
    six = daemon.ask(ALICE, "submit", **VALID, cpus=6)["id"]
    four = daemon.ask(ALICE, "submit", **VALID, cpus=4)["id"]
    two = daemon.ask(ALICE, "submit", **VALID, cpus=2)["id"]
    world.tick()
    assert world.state(six) == JobState.RUNNING
    assert world.job(four).waiting_reason == "waits for cores: 2 of 8 free, needs 4"
    assert world.state(two) == JobState.RUNNING  # behind it, and it fits
    world.finish(six)
    world.tick()
    assert world.state(four) == JobState.RUNNING


def test_each_job_starts_with_its_ask_or_its_gpus_share(daemon: Daemon) -> None:
    world = daemon.world
    asked = daemon.ask(ALICE, "submit", **VALID, ram=3 * GiB, cpus=3)["id"]
    default = daemon.ask(ALICE, "submit", **VALID)["id"]
    both = daemon.ask(ALICE, "submit", **{**VALID, "mem": None, "gpus": 2})["id"]
    world.tick()
    assert world.launcher.limits[asked] == (3 * GiB, 3)
    assert world.launcher.limits[default] == (30 * GiB, 4)  # one GPU of two: half
    world.finish(asked)
    world.finish(default)
    world.tick()
    assert world.launcher.limits[both] == (60 * GiB, 8)


def test_an_ask_no_cgroup_could_enforce_is_refused(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])  # the fake launcher's default: no job cgroups
    daemon = Daemon(world)
    try:
        with pytest.raises(UsageError, match=r"--ram cannot be enforced here \(no job cgroups\)"):
            daemon.ask(ALICE, "submit", **VALID, ram=2 * GiB)
        world.launcher.facts = HostFacts(no_memory=None, no_cpuset="no cpuset cgroup hierarchy")
        with pytest.raises(UsageError, match="--cpus cannot be enforced here \\(no cpuset"):
            daemon.ask(ALICE, "submit", **VALID, cpus=1)
        assert daemon.ask(ROOT, "status", all=True)["jobs"] == []
        world.tick()
        assert world.launcher.limits == {}
    finally:
        world.scheduler.store.close()


@pytest.mark.parametrize(
    ("ask", "message"),
    [
        ({"ram": 61 * GiB}, r"--ram 61G is more than this server gives its jobs \(60G of host"),
        ({"cpus": 9}, r"--cpus 9 is more than this server gives its jobs \(8 cores\)"),
    ],
)
def test_an_ask_that_could_never_fit_is_refused(
    daemon: Daemon, ask: dict[str, int], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        daemon.ask(ALICE, "submit", **VALID, **ask)
    assert daemon.ask(ROOT, "status", all=True)["jobs"] == []


def test_ram_over_the_owners_host_mem_limit_is_refused(tmp_path: Path) -> None:
    limits: dict[str, Any] = {"limits": {"users": {"alice": {"host_mem": "8G"}}}}
    world = make_world(tmp_path, [24 * GiB, 24 * GiB], **RESERVE, **limits)
    world.launcher.facts = ENFORCED
    daemon = Daemon(world)
    try:
        with pytest.raises(
            UsageError, match=r"--ram 9G is more than alice's host_mem limit \(8G\)"
        ):
            daemon.ask(ALICE, "submit", **VALID, ram=9 * GiB)
        plain = daemon.ask(ALICE, "submit", **VALID)["id"]
        world.tick()
        assert world.launcher.limits[plain] == (8 * GiB, 4)  # host_mem caps its default
    finally:
        world.scheduler.store.close()


def test_the_host_block_is_read_and_checked() -> None:
    host = load_config(None, {"host": {"ram_reserve": "8G", "cpu_reserve": 2}}).host
    assert host == HostSettings(ram_reserve_fraction=0.0, ram_reserve_bytes=8 * GiB, cpu_reserve=2)
    assert load_config(None, {"host": {"ram_reserve": "25%"}}).host.ram_reserve_fraction == 0.25
    assert load_config(None, {"host": {"job_cpus": "all"}}).host.job_cpus == JOB_CPUS_ALL
    assert load_config(None, {"host": {"job_ram": "4G"}}).host.job_ram_bytes == 4 * GiB
    assert load_config(None, {}).host == HostSettings()  # 10 %, at least 2G; no cores kept
    for bad, words in [
        ({"ram_reserve": "100%"}, "ram_reserve: expected a percentage from 0% to under 100%"),
        ({"cpu_reserve": -1}, "cpu_reserve: expected a whole number >= 0"),
        ({"job_cpus": 0}, "job_cpus: expected a whole number >= 1"),
        ({"job_ram": "1M"}, "job_ram 1M: at least 64M"),
        ({"cores": 2}, "unknown key 'cores'"),
    ]:
        with pytest.raises(ConfigError, match=f"key 'host': {re.escape(words)}"):
            load_config(None, {"host": bad})


def test_the_shipped_config_documents_the_host_block_with_its_defaults() -> None:
    shipped = Path(__file__).resolve().parents[1] / "config" / "gpusched.yaml"
    assert load_config(shipped).host == HostSettings()
    text = shipped.read_text()
    for key in ("ram_reserve", "ram_reserve_min", "cpu_reserve", "job_ram", "job_cpus"):
        assert f"#   {key}:" in text, key


def test_run_takes_them_too_its_client_confined_and_released(daemon: Daemon) -> None:
    """`gpusched run --ram --cpus`: refused as submit's where nothing enforces them;
    admitted alike; its client process put in the job's cgroups as it is placed (the fake
    launcher notes what it was asked), and those released at its end."""
    world = daemon.world
    me = Caller(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), user="me", admin=False)
    run = {"command": ["bash"], "cwd": "/", "mem": 4 * GiB}
    with pytest.raises(UsageError, match="--cpus 9 is more than this server gives"):
        daemon.ask(me, "run", **run, cpus=9)
    hog = daemon.ask(ALICE, "submit", **VALID, ram=50 * GiB)["id"]
    job = daemon.ask(me, "run", **run, ram=12 * GiB, cpus=2)
    assert (job["ram"], job["cpus"]) == (12 * GiB, 2)
    world.tick()
    assert world.job(job["id"]).waiting_reason == (
        "waits for host memory: 10G of 60G free, needs 12G"
    )
    world.finish(hog)
    world.tick()
    assert daemon.ask(me, "placement", id=job["id"], timeout=0)["job"]["state"] == "running"
    assert world.launcher.limits[job["id"]] == (12 * GiB, 2)
    daemon.ask(me, "run_ended", id=job["id"], exit_code=0)
    assert world.launcher.released == [job["id"]]
    world.launcher.facts = HostFacts()  # no job cgroups
    with pytest.raises(UsageError, match="--ram cannot be enforced here"):
        daemon.ask(me, "run", **run, ram=GiB)


def test_what_a_job_used_of_the_host_is_kept_and_shown(daemon: Daemon) -> None:
    world = daemon.world
    job = daemon.ask(ALICE, "submit", **VALID, ram=3 * GiB)["id"]
    world.tick()
    measured = Outcome(OutcomeKind.EXIT, exit_code=0, run_s=10.0, host_peak_bytes=GiB, cpu_s=25.0)
    world.finish(job, measured)
    shown = daemon.ask(ROOT, "show", id=job)
    assert (shown["host_peak"], shown["cpu_s"]) == (GiB, 25.0)
    lines = show_lines(shown, 100)
    assert any(line.startswith("host peak") and "1G of host memory" in line for line in lines)
    assert any(
        line.startswith("cpu time") and "25.0s (on average 2.5 cores)" in line for line in lines
    )
    history = daemon.ask(ROOT, "history", all=True)
    assert [(j["host_peak"], j["cpu_s"]) for j in history] == [(GiB, 25.0)]


def test_cores_busy_throughout_while_the_gpu_waits_earn_a_hint(daemon: Daemon) -> None:
    """--cpus 2, both busy on average over ten minutes, while its card read 20 % busy: the
    end's figures gain the hint (the cores, not the GPU, were the bound); on half its
    cores, none. The card's reading is given as the end's figures carry it (a fake job has
    no live process for the monitor to sample)."""
    from gpusched.scheduling.endings import _with_host_used

    world = daemon.world
    job = world.scheduler.store.jobs.get(daemon.ask(ALICE, "submit", **VALID, cpus=2)["id"])
    cores = world.scheduler.endings._cores_of(job)
    assert cores == 2
    figures: dict[str, object] = {"mean_util": 20, "hints": ["an earlier hint"]}
    busy = Outcome(OutcomeKind.EXIT, exit_code=0, run_s=600.0, cpu_s=1190.0)
    values = _with_host_used(figures, busy, cores)
    assert values is not None and values["hints"] == [
        "an earlier hint",
        "used 2.0 of 2 cores on average while the GPU was 20% busy: raise --cpus, or"
        " num_workers if the loader is the bottleneck",
    ]
    calm = Outcome(OutcomeKind.EXIT, exit_code=0, run_s=600.0, cpu_s=600.0)
    values = _with_host_used(figures, calm, cores)
    assert values is not None and values["hints"] == ["an earlier hint"]
    default = world.scheduler.store.jobs.get(daemon.ask(ALICE, "submit", **VALID)["id"])
    assert world.scheduler.endings._cores_of(default) == 4  # 8 cores, its GPU's share


def test_the_cores_hint_needs_a_long_enough_run_and_a_waiting_gpu() -> None:
    from gpusched.core.hints import cores_hint

    assert cores_hint(1190.0, 600.0, 2, 30.0) is not None
    assert cores_hint(1190.0, 600.0, 2, 85.0) is None  # the GPU was busy: no bound here
    assert cores_hint(119.0, 60.0, 2, 30.0) is None  # too short to judge
    assert cores_hint(1190.0, 600.0, 4, 30.0) is None  # half its cores idle
    assert cores_hint(1190.0, 600.0, 2, None) is None  # no utilization reading
