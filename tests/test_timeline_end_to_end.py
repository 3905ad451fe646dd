"""End to end: a job's memory and utilization over time, from the fake NVML driver to
`show --json`'s `timeline` and `show`'s sparklines.

The real daemon runs on the fake NVML driver; each test job (tests/fakenvml/gpujob.py)
holds the memory and shows the SM utilization the test tells it to, so every point the
daemon records is one the test chose.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml

GiB = 2**30


def start(daemon_factory: Any, fake: FakeNvml) -> RunningDaemon:
    return daemon_factory(simulate=None, config={"poll_interval": "0.3s"}, env=fake.env()).start()


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_show_has_the_timeline_the_driver_reported_and_draws_it(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set_gpus([24 * GiB] * 2)
    daemon = start(daemon_factory, fake_nvml)
    # 3G at 30 % busy, then 6G swinging between 70 % and 90 %.
    grower = daemon.submit(
        "--mem", "8G", "--",
        *fake_nvml.gpujob_argv(
            "--mem", "3G", "--util", "30", "--grow", "6G", "--grow-after", "1.5",
            "--util-cycle", "70,90", "--util-period", "0.6", "--hold", "4",
        ),
    )  # fmt: skip
    # 2G on each of two GPUs: the timeline sums them.
    wide = daemon.submit(
        "--mem", "2G", "--gpus", "2", "--",
        *fake_nvml.gpujob_argv("--mem", "2G", "--util", "50", "--hold", "2"),
    )  # fmt: skip
    held = daemon.submit("--hold", "--mem", "1G", "--", "true")

    # While it runs, the points so far (from the daemon's memory, before any flush).
    live = eventually(lambda: (j := daemon.show(grower))["timeline"] and j)
    assert live["state"] == "running"
    assert live["timeline"][0]["memory"] == 3 * GiB

    jobs = {j.id: j for j in daemon.client().wait([grower, wide], timeout=40)}
    assert {str(j.state) for j in jobs.values()} == {"done"}

    shown = daemon.show(grower)
    points = shown["timeline"]
    assert len(points) >= 8  # a point per 0.3 s poll over ~4.5 s (the first minutes)
    memories = [p["memory"] for p in points]
    assert set(memories) == {3 * GiB, 6 * GiB}
    assert memories == sorted(memories)
    assert max(memories) == shown["peak_mem"]
    utils = [p["util"] for p in points]
    assert set(utils) - {None} <= {30.0, 70.0, 90.0}
    assert points[0]["util"] == 30.0
    assert {70.0, 90.0} <= set(utils[-5:])
    times = [epoch(p["t"]) for p in points]
    assert times == sorted(times)
    assert epoch(shown["started_at"]) <= times[0]
    assert times[-1] <= epoch(shown["ended_at"])
    assert all(p["t"].endswith("+00:00") for p in points)  # UTC, like every time shown

    wide_points = daemon.show(wide)["timeline"]
    assert wide_points
    assert {p["memory"] for p in wide_points} == {4 * GiB}
    assert {p["util"] for p in wide_points} <= {50.0, None}

    assert daemon.show(held)["timeline"] == []

    # The sparklines: a full block would be the declared 8G; 6G is the 6th of 8 levels.
    text = daemon.cli("show", str(grower), env={**daemon.env, "PYTHONIOENCODING": "utf-8"})
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    [memory] = [line for line in lines if line.startswith("memory:    ")]
    [busy] = [line for line in lines if line.startswith("gpu busy:  ")]
    assert memory.endswith("▆  █ declared 8.0G")
    assert memory[11] == "▃"  # 3G first
    assert busy.endswith("  █ 100%")
    assert busy[11] == "▃"  # 30 % first
    assert lines[lines.index(busy) + 1].startswith("           peak 6.0G; ")
    assert all(len(line) <= 80 for line in (memory, busy))
    # Where the terminal cannot print blocks: ASCII.
    plain = daemon.cli("show", str(grower), env={**daemon.env, "PYTHONIOENCODING": "ascii"})
    assert plain.returncode == 0, plain.stderr
    assert "@ declared 8.0G" in plain.stdout
    plain.stdout.encode("ascii")
    waiting = daemon.cli("show", str(held)).stdout
    assert "timeline:  no samples yet" in waiting


def test_a_stopped_daemon_writes_the_points_it_held_in_memory(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    """SIGTERM (a restart) loses no buffered point: the store holds every point `show`
    saw just before, though no periodic flush (every 60 s) has come yet."""
    from gpusched.config.settings import load_config
    from gpusched.store import Store

    fake_nvml.set_gpus([24 * GiB])
    daemon = start(daemon_factory, fake_nvml)
    job_id = daemon.submit(
        "--mem", "4G", "--", *fake_nvml.gpujob_argv("--mem", "2G", "--util", "40", "--hold", "60")
    )  # fmt: skip

    def four_points() -> list[dict[str, Any]] | None:
        points: list[dict[str, Any]] = daemon.show(job_id)["timeline"]
        return points if len(points) >= 4 else None

    seen = eventually(four_points, timeout=30)
    assert seen is not None  # it is: eventually returns a true value
    daemon.stop()
    stored = Store(load_config(daemon.config_path).database_url)
    try:
        points = stored.timeline.job_timeline(job_id)
    finally:
        stored.close()
        daemon.kill_jobs()
    assert len(points) >= len(seen)
    assert [p.to_json()["t"] for p in points[: len(seen)]] == [p["t"] for p in seen]
