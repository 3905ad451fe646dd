"""Idle cost: the daemon's CPU and resident memory with 8 GPUs polled every second, and
with 3 running jobs at the default poll against the same daemon with the probe stubbed out.

The GPUs are the fake NVML driver (tests/fakenvml/fakenvml.c, compiled here with gcc
as tests/fakenvml/fixtures.py does), showing eight idle 80 GB cards; its state file is
written with `tests.fakenvml.state`. The daemon runs WITHOUT `simulate`, so every poll
goes through pynvml into the driver library, with LD_LIBRARY_PATH and FAKENVML_STATE
set, `poll_interval: 1s`, and no job. After a settling period, psutil samples the
daemon process over the measuring window: CPU as (user + system time) / wall time,
RSS once a second. Its supervisor zygote (gpusched.processes.zygote, a separate process the
daemon starts) is measured the same way after it, and reported on its own. Baseline in
the same run: a bare `python -c` process that imports nothing and sleeps.

Then issue 30's pair, each measured the same way: the daemon on the same 8 fake NVML GPUs
at the default `poll_interval` with 3 running jobs (`sleep`, 1G each), and the same
daemon, config and jobs with the probe stubbed out (`simulate: 8x80G`: GPUs from the
config, no NVML call). The difference is the probe's share of the idle cost.

    python benchmarks/idle.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _common import Figure, GiB, print_conditions, report

from gpusched.core.models import GpuReport
from tests.daemon_harness import RunningDaemon
from tests.fakenvml import state as fakestate
from tests.fakenvml.fixtures import FakeNvml, build_fake_nvml

SETTLE_S = 3.0
RUNNING_JOBS = 3


def eight_gpus(daemon: RunningDaemon) -> list[GpuReport]:
    """The daemon's 8 GPUs, once its first poll has read them (a loaded machine is slow)."""
    deadline = time.monotonic() + 60
    while len(gpus := daemon.client().status().gpus) != 8:
        assert time.monotonic() < deadline, gpus
        time.sleep(0.2)
    return gpus


def with_jobs(root: Path, fake: FakeNvml | None, seconds: float) -> tuple[float, float, float]:
    """(CPU %, median RSS MB, max RSS MB) of a daemon at the default poll with 3 running
    jobs: on the fake NVML driver, or with the probe stubbed out (`fake` None)."""
    root.mkdir()
    daemon = RunningDaemon(
        root,
        simulate=None if fake else "8x80G",
        env=fake.env() if fake else None,
    ).start()
    try:
        eight_gpus(daemon)
        client = daemon.client()
        ids = [
            client.submit(["sleep", "3600"], mem="1G", cwd=str(root)).id
            for _ in range(RUNNING_JOBS)
        ]
        deadline = time.monotonic() + 60
        while any(client.job(i).state != "running" for i in ids):
            assert time.monotonic() < deadline, [client.job(i).state for i in ids]
            time.sleep(0.2)
        assert daemon.process is not None
        time.sleep(SETTLE_S)
        return measure(daemon.process.pid, seconds)
    finally:
        daemon.stop()
        daemon.kill_jobs()


def measure(pid: int, seconds: float) -> tuple[float, float, float]:
    """(CPU percent of one core, median RSS MB, max RSS MB) of `pid` over `seconds`."""
    process = psutil.Process(pid)
    before = process.cpu_times()
    start = time.perf_counter()
    rss = []
    while time.perf_counter() - start < seconds:
        rss.append(process.memory_info().rss)
        time.sleep(1.0)
    after = process.cpu_times()
    wall = time.perf_counter() - start
    cpu = (after.user + after.system) - (before.user + before.system)
    return 100 * cpu / wall, statistics.median(rss) / 2**20, max(rss) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print_conditions()
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        fake = FakeNvml(build_fake_nvml(root / "fakenvml"), root / "fakenvml.state")
        fake.set_gpus([80 * GiB] * 8)
        (root / "daemon").mkdir()
        daemon = RunningDaemon(
            root / "daemon",
            simulate=None,
            config={"poll_interval": "1s"},
            env=fake.env(),
        ).start()
        try:
            gpus = eight_gpus(daemon)
            assert all(g.state == "ok" for g in gpus), gpus
            assert daemon.process is not None
            time.sleep(SETTLE_S)
            cpu, rss, rss_max = measure(daemon.process.pid, args.seconds)
            zygote = next(
                c
                for c in psutil.Process(daemon.process.pid).children()
                if "gpusched.processes.zygote" in c.cmdline()
            )
            zygote_cpu, _, zygote_rss = measure(zygote.pid, min(args.seconds, 5.0))
            zygote_uss = zygote.memory_full_info().uss / 2**20
            reads_before = fakestate.read_state(fake.state_path)
            assert len(reads_before.gpus) == 8
        finally:
            daemon.stop()
            daemon.kill_jobs()
        probed = with_jobs(root / "probed", fake, args.seconds)
        stubbed = with_jobs(root / "stubbed", None, args.seconds)
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        try:
            time.sleep(SETTLE_S)
            bare_cpu, bare_rss, _ = measure(bare.pid, min(args.seconds, 5.0))
        finally:
            bare.kill()
            bare.wait()
    print(f"daemon on 8 fake NVML GPUs, poll every 1 s, idle, over {args.seconds:.0f} s:")
    print(f"  CPU {cpu:.2f} % of one core; RSS median {rss:.1f} MB, max {rss_max:.1f} MB")
    print(
        f"  its supervisor zygote: CPU {zygote_cpu:.2f} %, RSS {zygote_rss:.1f} MB"
        f" (unique to it: {zygote_uss:.1f} MB)"
    )
    print(f"  bare sleeping python: CPU {bare_cpu:.2f} %, RSS {bare_rss:.1f} MB")
    print(f"{RUNNING_JOBS} running jobs, default poll, over {args.seconds:.0f} s each:")
    for label, (j_cpu, j_rss, j_max) in (
        ("8 fake NVML GPUs", probed),
        ("probe stubbed out (simulate: 8x80G)", stubbed),
    ):
        print(
            f"  {label}: CPU {j_cpu:.2f} % of one core; RSS median {j_rss:.1f}, max {j_max:.1f} MB"
        )
    report(
        "idle",
        [
            Figure("daemon CPU, idle, 8 GPUs polled every 1 s", cpu, "% core", "< 1", cpu < 1),
            Figure("daemon RSS, idle (max)", rss_max, "MB", "< 80", rss_max < 80),
            Figure("daemon RSS / bare python RSS", rss_max / bare_rss, "x"),
            Figure("supervisor zygote RSS, idle (max)", zygote_rss, "MB"),
            Figure("bare python RSS (baseline)", bare_rss, "MB"),
            Figure(f"daemon CPU, {RUNNING_JOBS} jobs, fake NVML", probed[0], "% core"),
            Figure(f"daemon CPU, {RUNNING_JOBS} jobs, probe stubbed", stubbed[0], "% core"),
            Figure(f"daemon RSS max, {RUNNING_JOBS} jobs, fake NVML", probed[2], "MB"),
            Figure(f"daemon RSS max, {RUNNING_JOBS} jobs, probe stubbed", stubbed[2], "MB"),
        ],
    )


if __name__ == "__main__":
    main()
