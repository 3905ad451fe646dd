"""Dispatch overhead: 200 back-to-back `true` jobs through one slot, gpusched vs task-spooler.

Both queues get the same shape of run: a blocker job holds the only slot while the 200
jobs are submitted, so submitting is not timed with dispatching; the clock starts when
the blocker is released (it reads one byte from a FIFO) and stops when the last job has
ended. Per-job overhead = that time / 200 (each `true` runs for about a millisecond).

gpusched: a real daemon (`simulate: 1x24G`, `headroom: 0`) in a temp dir; jobs are
submitted through the Python API `gpusched.client.Client` with `mem="24G"`, so exactly
one runs at a time, and the end is seen with `Client.wait()`.
task-spooler: `tsp -S 1` on a private TS_SOCKET, jobs submitted with `tsp CMD`, the end
seen with `tsp -w ID` (its output files kept, as gpusched keeps logs).

The gpusched jobs' own timestamps split the time into "gap" (last job ended -> next
started, the scheduling pass) and "run" (started -> ended: spec, supervisor start,
`true`, exit record, the end noticed). The CPU time the whole machine spent per job
(from /proc/stat, all processes) is steadier than wall time on a shared machine.

The floor: what the least a queue with gpusched's guarantees must do per job costs
here, measured in the same run with no scheduler around it: one fsynced SQLite commit
(the start, recorded before the job may run, so a crash never runs it twice), a
supervisor process (the smallest there is: a shell) that starts the job and waits for
it, and an exit record written with fsync (file and directory), so its exit code
survives a power cut.

    python benchmarks/dispatch.py [--jobs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
from _common import Figure, print_conditions, profiled, report

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon

TSP_NAMES = ("tsp", "ts")  # Debian's task-spooler installs `tsp`


def _blocker(fifo: Path) -> list[str]:
    return ["head", "-c1", str(fifo)]


def machine_cpu_s() -> float:
    """CPU time spent by the whole machine so far (every process, user + system), in s."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait
    busy = fields[0] + fields[1] + fields[2] + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, reaped_children: bool = False) -> float:
    """CPU time of one process (user + system), with its reaped descendants' if asked."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


# Run in a fresh interpreter that imports what the zygote imports, so the fork copies a
# process of the zygote's size, not this benchmark's.
_SUPERVISOR_ALONE = """
import json, os, resource, shutil, statistics, sys, time
from pathlib import Path
from gpusched.processes.zygote import fork_supervisor

root, rounds, true = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
job_dir = root / "jobs" / "1"
walls = []
before = resource.getrusage(resource.RUSAGE_CHILDREN)
for i in range(rounds):
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    spec = {"job_id": 1, "argv": [true], "cwd": str(root), "env": {}, "uid": os.getuid(),
            "gid": os.getgid(), "groups": [], "umask": 0o22, "log_path": str(job_dir / "log"),
            "kill_grace_s": 1.0, "time_limit_s": None}
    (job_dir / "spec.json").write_text(json.dumps(spec))
    began = time.perf_counter()
    os.waitpid(fork_supervisor(job_dir / "spec.json"), 0)
    walls.append(time.perf_counter() - began)
    assert json.loads((job_dir / "exit.json").read_text())["exit_code"] == 0
after = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(json.dumps({"wall_s": statistics.median(walls), "cpu_s": cpu / rounds,
                  "faults": (after.ru_minflt - before.ru_minflt) / rounds}))
"""


def supervisor_alone(root: Path, rounds: int = 100) -> dict[str, float]:
    """One job's supervisor, forked as the zygote forks it, running `true`: medians."""
    true = shutil.which("true") or "/bin/true"
    done = subprocess.run(
        [sys.executable, "-c", _SUPERVISOR_ALONE, str(root), str(rounds), true],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def durable_floor(root: Path, rounds: int = 300) -> dict[str, float]:
    """Median cost of each step every job must take under gpusched's guarantees (s)."""
    db = sqlite3.connect(root / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT)")
    db.execute("INSERT INTO jobs VALUES (1, 'queued')")
    record = root / "exit.json"
    true = shutil.which("true") or "/bin/true"
    shell = shutil.which("sh") or "/bin/sh"

    def commit(i: int) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = ? WHERE id = 1", (f"running {i}",))
        db.execute("COMMIT")

    def supervised_job(_i: int) -> None:
        # The smallest supervisor there is: a shell (dash on Debian) that starts the job,
        # waits for it and runs one builtin after it. gpusched's is a forked Python.
        os.waitpid(os.posix_spawn(shell, [shell, "-c", f"{true}; :"], os.environ), 0)

    def exit_record(i: int) -> None:
        tmp = record.with_name("exit.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps({"outcome": "exit", "exit_code": 0, "i": i}).encode())
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, record)
        dir_fd = os.open(root, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)

    steps = {
        "start committed (SQLite, synchronous=FULL)": commit,
        "a supervisor starts the job (`sh -c 'true; :'`)": supervised_job,
        "exit record fsynced (file + directory)": exit_record,
    }
    medians = {}
    for name, step in steps.items():
        samples = []
        for i in range(rounds):
            began = time.perf_counter()
            step(i)
            samples.append(time.perf_counter() - began)
        medians[name] = statistics.median(samples)
    db.close()
    return medians


def _release(fifo: Path) -> float:
    """Let the blocker end; returns the time the release was sent."""
    start = time.perf_counter()
    with open(fifo, "wb") as handle:  # blocks until the blocker has opened the FIFO
        handle.write(b"x")
    return start


def bench_gpusched(n_jobs: int, root: Path) -> dict[str, float]:
    daemon = RunningDaemon(root, simulate="1x24G", config={"headroom": 0})
    daemon.start()
    try:
        client = Client(daemon.socket_path)
        fifo = root / "release.fifo"
        os.mkfifo(fifo)
        blocker = client.submit(_blocker(fifo), mem="24G", cwd=root)
        daemon.wait_state(blocker.id, {"running"})
        began = time.perf_counter()
        ids = [client.submit(["true"], mem="24G", cwd=root).id for _ in range(n_jobs)]
        submit_s = time.perf_counter() - began
        assert daemon.process is not None
        with profiled(daemon.process.pid, "dispatch-daemon"):
            # The zygote reaps the supervisors it forks, and they reap their jobs: its
            # reaped-children time is the job side of the work.
            (zygote,) = [
                child
                for child in psutil.Process(daemon.process.pid).children()
                if "gpusched.processes.zygote" in child.cmdline()
            ]
            daemon_before = process_cpu_s(daemon.process.pid)
            job_side_before = process_cpu_s(zygote.pid, reaped_children=True)
            cpu_before = machine_cpu_s()
            start = _release(fifo)
            jobs = client.wait([ids[-1]], timeout=600)
            elapsed = time.perf_counter() - start
            cpu_s = machine_cpu_s() - cpu_before
            daemon_s = process_cpu_s(daemon.process.pid) - daemon_before
            time.sleep(0.2)  # the last supervisor reaped
            job_side_s = process_cpu_s(zygote.pid, reaped_children=True) - job_side_before
        assert jobs[0].state == "done", jobs[0]
        done = {j.id: j for j in client.history(limit=n_jobs + 10)}
        assert all(done[i].state == "done" for i in ids), "some jobs did not succeed"
        stamps = [
            (
                datetime.fromisoformat(done[i].started_at or ""),
                datetime.fromisoformat(done[i].ended_at or ""),
            )
            for i in ids
        ]
        runs = [(end - begin).total_seconds() for begin, end in stamps]
        gaps = [(stamps[k + 1][0] - stamps[k][1]).total_seconds() for k in range(len(stamps) - 1)]
        return {
            "elapsed_s": elapsed,
            "per_job_s": elapsed / n_jobs,
            "cpu_per_job_s": cpu_s / n_jobs,
            "daemon_cpu_per_job_s": daemon_s / n_jobs,
            "job_side_cpu_per_job_s": job_side_s / n_jobs,
            "submit_per_job_s": submit_s / n_jobs,
            "run_median_s": statistics.median(runs),
            "gap_median_s": statistics.median(gaps),
        }
    finally:
        daemon.stop()
        daemon.kill_jobs()


def find_tsp() -> str | None:
    for name in TSP_NAMES:
        path = shutil.which(name)
        if (
            path
            and "task"
            in subprocess.run([path, "-h"], capture_output=True, text=True, check=False).stdout
            + "task spooler"
        ):  # `ts` may be moreutils' timestamp filter on some systems
            return path
    return None


def bench_tsp(tsp: str, n_jobs: int, root: Path) -> dict[str, float]:
    env = {
        **os.environ,
        "TS_SOCKET": str(root / "tsp.sock"),
        "TMPDIR": str(root),  # its output files
        "TS_MAXFINISHED": str(n_jobs + 10),
        "TS_SAVELIST": "",
    }
    env.pop("TS_SLOTS", None)

    def ts(*args: str) -> str:
        done = subprocess.run([tsp, *args], env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    ts("-S", "1")  # starts its server with one slot
    try:
        fifo = root / "release.fifo"
        os.mkfifo(fifo)
        ts(*_blocker(fifo))
        began = time.perf_counter()
        ids = [ts("true") for _ in range(n_jobs)]
        submit_s = time.perf_counter() - began
        cpu_before = machine_cpu_s()
        start = _release(fifo)
        ts("-w", ids[-1])
        elapsed = time.perf_counter() - start
        cpu_s = machine_cpu_s() - cpu_before
        states = ts("-l")
        assert states.count("finished") == n_jobs + 1, states[-2000:]
        return {
            "elapsed_s": elapsed,
            "per_job_s": elapsed / n_jobs,
            "cpu_per_job_s": cpu_s / n_jobs,
            "submit_per_job_s": submit_s / n_jobs,
        }
    finally:
        subprocess.run([tsp, "-K"], env=env, capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    print_conditions()
    tsp = find_tsp()
    if tsp is None:
        sys.exit("task-spooler not found: apt-get install task-spooler (its command is tsp)")
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        (root / "gpusched").mkdir()
        (root / "tsp").mkdir()
        (root / "floor").mkdir()
        ours = bench_gpusched(args.jobs, root / "gpusched")
        theirs = bench_tsp(tsp, args.jobs, root / "tsp")
        floor = durable_floor(root / "floor")
        alone = supervisor_alone(root / "floor")
    n = args.jobs
    print(f"{n} `true` jobs through one slot, after a blocker holding it is released")
    print(
        f"  gpusched (Client API): {ours['elapsed_s']:.2f} s, {1e3 * ours['per_job_s']:.1f} ms"
        f" per job; submit {1e3 * ours['submit_per_job_s']:.1f} ms per job"
    )
    print(
        "    from the jobs' timestamps: median run (started->ended)"
        f" {1e3 * ours['run_median_s']:.1f} ms, median gap (ended->next started)"
        f" {1e3 * ours['gap_median_s']:.1f} ms"
    )
    print(
        f"  task-spooler ({tsp}): {theirs['elapsed_s']:.2f} s, {1e3 * theirs['per_job_s']:.2f} ms"
        f" per job; submit {1e3 * theirs['submit_per_job_s']:.1f} ms per job (one tsp process each)"
    )
    print(
        f"  CPU time of the whole machine per job: gpusched {1e3 * ours['cpu_per_job_s']:.1f} ms,"
        f" task-spooler {1e3 * theirs['cpu_per_job_s']:.2f} ms"
    )
    print(
        f"    gpusched's daemon {1e3 * ours['daemon_cpu_per_job_s']:.1f} ms; zygote, supervisors"
        f" and jobs {1e3 * ours['job_side_cpu_per_job_s']:.1f} ms"
    )
    floor_s = sum(floor.values())
    print("  the floor, step by step (medians of 300, no scheduler around them):")
    for name, seconds in floor.items():
        print(f"    {name:<50} {1e3 * seconds:.3f} ms")
    print(
        f"    {'together':<50} {1e3 * floor_s:.3f} ms ="
        f" {floor_s / theirs['per_job_s']:.2f}x task-spooler's whole per-job cost"
    )
    print(
        "  one gpusched supervisor alone (forked as the zygote does, runs `true`, fsyncs its"
        f" exit record): {1e3 * alone['wall_s']:.2f} ms, of which {1e3 * alone['cpu_s']:.2f} ms"
        f" CPU and {alone['faults']:.0f} page faults (its job's included)"
    )
    ratio = ours["per_job_s"] / theirs["per_job_s"]
    report(
        "dispatch",
        [
            Figure("gpusched per-job dispatch overhead", 1e3 * ours["per_job_s"], "ms"),
            Figure("task-spooler per-job dispatch overhead", 1e3 * theirs["per_job_s"], "ms"),
            Figure("gpusched / task-spooler per-job overhead", ratio, "x", "<= 2", ratio <= 2),
            Figure("gpusched CPU time per job (whole machine)", 1e3 * ours["cpu_per_job_s"], "ms"),
            Figure("gpusched daemon CPU time per job", 1e3 * ours["daemon_cpu_per_job_s"], "ms"),
            Figure(
                "task-spooler CPU time per job (whole machine)", 1e3 * theirs["cpu_per_job_s"], "ms"
            ),
            Figure("floor: durable start, supervisor, job, exit record", 1e3 * floor_s, "ms"),
            Figure("floor / task-spooler per-job overhead", floor_s / theirs["per_job_s"], "x"),
            Figure("one supervisor alone, forked, running `true`", 1e3 * alone["wall_s"], "ms"),
            Figure("gpusched job run (started->ended), median", 1e3 * ours["run_median_s"], "ms"),
            Figure("gpusched gap (ended->next started), median", 1e3 * ours["gap_median_s"], "ms"),
            Figure("gpusched submit (Client), per job", 1e3 * ours["submit_per_job_s"], "ms"),
            Figure(
                "task-spooler submit (tsp CLI), per job", 1e3 * theirs["submit_per_job_s"], "ms"
            ),
        ],
    )


if __name__ == "__main__":
    main()
