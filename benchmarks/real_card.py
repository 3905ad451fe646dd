"""What only a real card shows: one short, prepared check for a lent GPU machine.

    python benchmarks/real_card.py --out DIR [--parts sharing,gpusched,idle] [--dry-run]

Three parts, each writing its figures to DIR as it goes (a part that fails does not stop
the next):

sharing   FIELD.md's sharing table measured again on this card: the C, S and M loops of
          _real_card_workload.py alone and together (separate processes on one card, as
          gpusched packs jobs), each loop's speed relative to alone, with NVML's device
          and per-process utilization sampled every 0.5 s meanwhile, and what the packing
          benchmark's sharing model (_packing_model.py, fitted on an H200) predicts for
          each row from the demands measured alone.
gpusched  the daemon on the real NVML driver, as root, starting jobs as a throw-away user:
          a busy job alone and a data-starved one alone (demand, hints), a second busy job
          of known demand waiting for a quieter card, a light job joining a busy one, two
          busy jobs forced onto one card with --share (the hints must say contention, not
          data loading), a job allocating more than it declared and one less (what `show`
          says it used).
idle      the daemon's CPU and memory with three running jobs at the default poll.

--dry-run runs the gpusched and idle parts on a simulated card with sleeping jobs, to
check the orchestration on a machine without a GPU. Needs root (it adds a user).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOAD = HERE / "_real_card_workload.py"
USER = "gsreal"
ROWS: list[tuple[str, ...]] = [
    ("C",),
    ("S",),
    ("M",),
    ("C", "C"),
    ("M", "M"),
    ("C", "M"),
    ("S", "S"),
    ("S", "S", "S", "S"),
    ("C", "S"),
    ("C", "S", "S", "S"),
]
H200 = {  # FIELD.md, "Measured on a real card": each job's speed vs alone
    "C+C": [0.475, 0.477],
    "M+M": [0.450, 0.449],
    "C+M": [0.487, 0.451],
    "S+S": [0.987, 0.987],
    "S+S+S+S": [0.974] * 4,
    "C+S": [0.961, 0.961],
    "C+S+S+S": [0.886, 0.935, 0.948, 0.948],
}


def log(out: Path, name: str, text: str) -> None:
    print(text, flush=True)
    with (out / name).open("a") as f:
        f.write(text + "\n")


# ---------------------------------------------------------------- sharing


class NvmlSampler:
    """Device and per-process SM utilization, sampled while a row runs."""

    def __init__(self) -> None:
        import pynvml  # type: ignore[import-untyped]

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.device: list[int] = []
        self.per_pid: dict[int, list[int | None]] = {}
        self.last_seen = 0

    def sample(self, pids: Sequence[int]) -> None:
        nvml = self.nvml
        self.device.append(nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        seen: dict[int, int] = {}
        try:
            for s in nvml.nvmlDeviceGetProcessUtilization(self.handle, self.last_seen):
                seen[s.pid] = max(seen.get(s.pid, 0), s.smUtil)
                self.last_seen = max(self.last_seen, s.timeStamp)
        except nvml.NVMLError:
            pass
        for pid in pids:
            self.per_pid.setdefault(pid, []).append(seen.get(pid))

    def memory_by_pid(self) -> dict[int, int]:
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        return {p.pid: int(p.usedGpuMemory or 0) for p in procs}


def run_row(
    kinds: tuple[str, ...], seconds: float, burst: int, sampler: NvmlSampler
) -> tuple[list[float], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        barrier = Path(tmp)
        procs = []
        for i, kind in enumerate(kinds):
            cmd = [sys.executable, str(WORKLOAD), kind, "--seconds", str(seconds)]
            cmd += ["--barrier", tmp, "--count", str(len(kinds))]
            cmd += ["--result", str(barrier / f"result-{i}.json")]
            if kind == "S" and burst:
                cmd += ["--burst", str(burst)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
        pids = [p.pid for p in procs]
        while len(list(barrier.glob("ready-*"))) < len(kinds):
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        sampler.device.clear()
        sampler.per_pid.clear()
        memory: dict[int, int] = {}
        window_end = time.monotonic() + seconds
        while time.monotonic() < window_end:
            time.sleep(0.5)
            sampler.sample(pids)
            if not memory:
                memory = sampler.memory_by_pid()
        for p in procs:
            p.wait(timeout=60)
        results = [
            json.loads((barrier / f"result-{i}.json").read_text()) for i in range(len(kinds))
        ]
    nvml: dict[str, Any] = {
        "device_util_mean": round(sum(sampler.device) / max(1, len(sampler.device)), 1),
        "device_util_samples": sampler.device,
        "per_process": [],
        "memory_mib": [round(memory.get(pid, 0) / 2**20) for pid in pids],
    }
    for pid, kind in zip(pids, kinds, strict=True):
        samples = sampler.per_pid.get(pid, [])
        got = [s for s in samples if s is not None]
        nvml["per_process"].append(
            {
                "kind": kind,
                "mean": round(sum(got) / len(got), 1) if got else None,
                "min": min(got) if got else None,
                "max": max(got) if got else None,
                "polls_without_sample": len(samples) - len(got),
                "polls": len(samples),
            }
        )
    rates = [float(r["steps_per_s"]) for r in results]
    if kinds == ("S",):
        nvml["burst"] = results[0]["burst"]
    return rates, nvml


def part_sharing(out: Path, seconds: float, rows_wanted: Sequence[tuple[str, ...]]) -> None:
    sys.path.insert(0, str(HERE))
    from _packing_model import Load, speeds

    sampler = NvmlSampler()
    alone: dict[str, float] = {}
    demand: dict[str, float] = {}
    burst = 0
    rows: list[dict[str, Any]] = []
    for kinds in rows_wanted:
        rates, nvml = run_row(kinds, seconds, burst, sampler)
        name = "+".join(kinds)
        if len(kinds) == 1:
            alone[kinds[0]] = rates[0]
            demand[kinds[0]] = float(nvml["device_util_mean"]) / 100
            if kinds == ("S",):
                burst = int(nvml["burst"])
            log(
                out, "sharing.txt", f"{name} alone: {rates[0]:.2f} steps/s, nvml {json.dumps(nvml)}"
            )
            rows.append({"row": name, "rates": rates, "nvml": nvml})
            continue
        rel = [r / alone[k] for r, k in zip(rates, kinds, strict=True)]
        model = speeds([Load(min(1.0, demand[k]), memory_bound=k == "M") for k in kinds])
        h200 = H200.get(name)
        log(
            out,
            "sharing.txt",
            f"{name}: each vs alone {[round(x, 3) for x in rel]} (sum {sum(rel):.3f}); "
            f"H200 {h200}; model {[round(x, 3) for x in model]} "
            f"(max error {max(abs(a - b) for a, b in zip(rel, model, strict=True)):.3f}); "
            f"nvml {json.dumps(nvml)}",
        )
        rows.append(
            {
                "row": name,
                "rates": rates,
                "vs_alone": rel,
                "model": model,
                "h200": h200,
                "nvml": nvml,
            }
        )
    (out / "sharing.json").write_text(
        json.dumps({"alone": alone, "demand": demand, "rows": rows}, indent=1)
    )


# ---------------------------------------------------------------- gpusched


class Lab:
    """A daemon as root on this machine's card, and a throw-away user who submits jobs."""

    def __init__(self, out: Path, dry_run: bool) -> None:
        self.out = out
        self.dry_run = dry_run
        self.root = Path("/tmp/gsreal")
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "work").mkdir(parents=True)
        # A throw-away tree under /tmp that the job's user must enter and write in.
        os.chmod(self.root, 0o755)  # noqa: S103
        os.chmod(self.root / "work", 0o777)  # noqa: S103
        # The user must read the package, the workload and the python it runs with.
        shutil.copytree(REPO / "gpusched", self.root / "src" / "gpusched")
        shutil.copy(WORKLOAD, self.root / "workload.py")
        subprocess.run(["chmod", "-R", "a+rX", str(self.root)], check=True)
        self.user = self._ensure_user()
        self.socket = self.root / "gpusched.sock"
        site = os.environ.get("PYTHONPATH", "")
        self.pythonpath = ":".join(p for p in [str(self.root / "src"), site] if p)
        config = {
            "socket": str(self.socket),
            "database": f"sqlite:///{self.root}/gpusched.db",
            "state_dir": str(self.root / "state"),
            "log_dir": str(self.root / "logs"),
            "hint_min_runtime": "10s",
        }
        if dry_run:
            config["simulate"] = "1x80G"
        (self.root / "gpusched.yaml").write_text(json.dumps(config))
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": self.pythonpath}
        self.daemon_log = (out / "daemon.log").open("a")
        self.daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpusched",
                "daemon",
                "--config",
                str(self.root / "gpusched.yaml"),
            ],
            env=env,
            stdout=self.daemon_log,
            stderr=subprocess.STDOUT,
            cwd=str(self.root),
        )
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start: see daemon.log")
            time.sleep(0.2)

    def _ensure_user(self) -> pwd.struct_passwd:
        try:
            return pwd.getpwnam(USER)
        except KeyError:
            pass
        if shutil.which("useradd"):
            subprocess.run(["useradd", "-m", USER], check=True)
        else:
            with open("/etc/group", "a") as f:
                f.write(f"{USER}:x:4242:\n")
            with open("/etc/passwd", "a") as f:
                f.write(f"{USER}:x:4242:4242::/tmp/gsreal/work:/bin/sh\n")
        return pwd.getpwnam(USER)

    def cli(self, *args: str, check: bool = True) -> str:
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": self.user.pw_dir,
            "USER": USER,
            "PYTHONPATH": self.pythonpath,
            "GPUSCHED_SOCKET": str(self.socket),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            check=False,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            env=env,
            cwd=str(self.root / "work"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"gpusched {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def job_command(self, kind: str, seconds: float, alloc: float = 0.0) -> list[str]:
        if self.dry_run:
            return [sys.executable, "-c", f"import time; time.sleep({seconds})"]
        cmd = [sys.executable, str(self.root / "workload.py"), kind, "--seconds", str(seconds)]
        if alloc:
            cmd += ["--alloc", str(alloc)]
        return cmd

    def submit(self, *options: str, kind: str, seconds: float, alloc: float = 0.0) -> str:
        return self.cli("submit", *options, "--", *self.job_command(kind, seconds, alloc)).strip()

    def show(self, job: str) -> dict[str, object]:
        return json.loads(self.cli("show", "--json", job))

    def wait_state(self, job: str, states: set[str], timeout: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.show(job)
            if shown.get("state") in states or time.monotonic() > deadline:
                return shown
            time.sleep(1)

    def record(self, title: str, *jobs: str) -> None:
        log(self.out, "gpusched.txt", f"== {title}")
        for job in jobs:
            log(self.out, "gpusched.txt", self.cli("show", job, check=False))
            log(self.out, "gpusched.json", json.dumps(self.show(job)))

    def close(self) -> None:
        self.daemon.terminate()
        try:
            self.daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
        self.daemon_log.close()


ENDED = {"done", "failed", "cancelled", "lost"}


def part_gpusched(out: Path, lab: Lab, seconds: float) -> None:
    busy = lab.submit("--mem", "4G", "--name", "train-c", kind="C", seconds=seconds)
    lab.wait_state(busy, ENDED, seconds + 90)
    starved = lab.submit("--mem", "4G", "--name", "loader-s", kind="S", seconds=seconds)
    lab.wait_state(starved, ENDED, seconds + 90)
    lab.record("a busy job alone, then a data-starved one alone", busy, starved)

    first = lab.submit("--mem", "4G", "--name", "train-c", kind="C", seconds=seconds)
    lab.wait_state(first, {"running"}, 60)
    second = lab.submit("--mem", "4G", "--name", "train-c", kind="C", seconds=seconds)
    time.sleep(6)
    log(out, "gpusched.txt", "== a second busy job while the first runs: status")
    log(out, "gpusched.txt", lab.cli("status"))
    lab.record("the second busy job, while the first runs", second)
    light = lab.submit("--mem", "4G", "--name", "loader-s", kind="S", seconds=seconds)
    time.sleep(6)
    lab.record("a light job of known demand beside the busy one", light)
    for job in (first, second, light):
        lab.wait_state(job, ENDED, 2 * seconds + 120)
    lab.record("the three, ended", first, second, light)

    forced = [
        lab.submit("--mem", "4G", "--share", "--name", f"forced-{i}", kind="C", seconds=seconds)
        for i in (1, 2)
    ]
    over = lab.submit(
        "--mem", "2G", "--share", "--name", "over", kind="A", seconds=seconds, alloc=6
    )
    under = lab.submit(
        "--mem", "10G", "--share", "--name", "under", kind="A", seconds=seconds, alloc=8
    )
    time.sleep(seconds * 0.7)
    log(
        out,
        "gpusched.txt",
        "== two busy jobs forced together (--share) and two allocations: status",
    )
    log(out, "gpusched.txt", lab.cli("status"))
    lab.record("forced together and allocations, while running", *forced, over, under)
    for job in (*forced, over, under):
        lab.wait_state(job, ENDED, seconds + 120)
    lab.record("forced together and allocations, ended", *forced, over, under)


def part_idle(out: Path, lab: Lab, seconds: float) -> None:
    import psutil

    jobs = [
        lab.submit("--mem", "2G", "--share", "--name", f"idle-{i}", kind="S", seconds=seconds + 20)
        for i in range(3)
    ]
    for job in jobs:
        lab.wait_state(job, {"running"}, 60)
    time.sleep(8)
    daemon = psutil.Process(lab.daemon.pid)
    before, wall = daemon.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, wall = daemon.cpu_times(), time.monotonic() - wall
    cpu = (after.user + after.system - before.user - before.system) / wall
    rss = daemon.memory_info().rss
    log(
        out,
        "idle.txt",
        f"daemon with 3 running jobs, default poll: {100 * cpu:.2f} % of a core over {wall:.0f} s, "
        f"RSS {rss / 2**20:.1f} MiB",
    )
    for job in jobs:
        lab.cli("cancel", job, check=False)


def guarded(out: Path, name: str, part: Callable[[], None]) -> None:
    start = time.monotonic()
    try:
        part()
        log(out, "parts.txt", f"{name}: ok in {time.monotonic() - start:.0f} s")
    except Exception:
        log(
            out,
            "parts.txt",
            f"{name}: FAILED after {time.monotonic() - start:.0f} s\n{traceback.format_exc()}",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="sharing,gpusched,idle")
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="each sharing row's measured window"
    )
    parser.add_argument("--job-seconds", type=float, default=20.0, help="each gpusched job's run")
    parser.add_argument(
        "--rows",
        default="",
        help="sharing rows to run, e.g. C,S,S+S (default: all; alone rows first)",
    )
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    if "sharing" in parts and not args.dry_run:
        rows = [tuple(r.split("+")) for r in args.rows.split(",")] if args.rows else ROWS
        guarded(args.out, "sharing", lambda: part_sharing(args.out, args.seconds, rows))
    if parts & {"gpusched", "idle"}:
        lab = Lab(args.out, args.dry_run)
        try:
            if "gpusched" in parts:
                guarded(
                    args.out, "gpusched", lambda: part_gpusched(args.out, lab, args.job_seconds)
                )
            if "idle" in parts:
                guarded(args.out, "idle", lambda: part_idle(args.out, lab, 30.0))
        finally:
            lab.close()


if __name__ == "__main__":
    main()
