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

The floor (benchmarks/_dispatch_floor.py): each step a job's start and end must take
under gpusched's guarantees and the per-job steps of its sandbox (the durable start,
the spec written and deleted, the supervisor's identity, the log, oom_score_adj, the
job's cgroup when the daemon makes one, its private /dev/shm, the launch fence, a
supervisor starting the job, the fsynced exit record), each timed alone and printed
by name. It is measured in every round, between the daemons' runs, so each ratio
compares figures taken under the same load.

The daemon runs alone in a memory cgroup of its own where this machine allows one (as
root, a writable memory cgroup): as under systemd, it then makes a cgroup per job, and
the floor counts that step; `--no-cgroup` runs it in the benchmark's own.

`--baseline-tree DIR` (another checkout of gpusched, e.g. `git archive main | tar -x -C
DIR`) runs that tree's daemon too, alternated with this one's round by round (ABBA),
under the same conditions: before and after in one run.

    python benchmarks/dispatch.py [--jobs 200] [--rounds 3] [--baseline-tree DIR] [--no-cgroup]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
from _common import Figure, print_conditions, profiled, report
from _dispatch_floor import Floor, remove_cgroup_tree, scratch_cgroup

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


def supervisor_alone(root: Path, rounds: int = 100, tree: Path | None = None) -> dict[str, float]:
    """One job's supervisor, forked as the zygote forks it, running `true`: medians."""
    true = shutil.which("true") or "/bin/true"
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
    done = subprocess.run(
        [sys.executable, "-c", _SUPERVISOR_ALONE, str(root), str(rounds), true],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def package_dir(tree: Path | None) -> str:
    """Where the gpusched a daemon of `tree` imports lives (as the daemon is started:
    same interpreter, same working directory, same PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
    found = subprocess.run(
        [sys.executable, "-c", "import gpusched; print(gpusched.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    where = Path(found).parent.parent
    if tree is not None and where != tree:
        sys.exit(f"--baseline-tree {tree}: its daemon would run {where}'s gpusched instead")
    return str(where)


def _release(fifo: Path) -> float:
    """Let the blocker end; returns the time the release was sent."""
    start = time.perf_counter()
    with open(fifo, "wb") as handle:  # blocks until the blocker has opened the FIFO
        handle.write(b"x")
    return start


def bench_gpusched(
    n_jobs: int, root: Path, tree: Path | None = None, service: Path | None = None
) -> dict[str, float]:
    """`tree`: another gpusched checkout whose daemon runs instead of this one's.
    `service`: a memory cgroup the daemon starts in, alone (as under systemd)."""

    def enter_service() -> None:
        if service is not None:
            (service / "cgroup.procs").write_text(str(os.getpid()))

    env = {"PYTHONPATH": str(tree)} if tree is not None else None
    daemon = RunningDaemon(
        root, simulate="1x24G", config={"headroom": 0}, env=env, preexec=enter_service
    )
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
            "job_cgroups": float("each job in" in daemon.stderr()),
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


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="daemon runs per tree (default 3)")
    parser.add_argument("--floor-samples", type=int, default=100, help="per step and round")
    parser.add_argument("--baseline-tree", type=Path, help="another gpusched checkout to compare")
    parser.add_argument("--no-cgroup", action="store_true", help="no memory cgroup per daemon")
    args = parser.parse_args()
    print_conditions()
    tsp = find_tsp()
    if tsp is None:
        sys.exit("task-spooler not found: apt-get install task-spooler (its command is tsp)")
    base = None if args.baseline_tree is None else args.baseline_tree.resolve()
    if base is not None and not (base / "gpusched" / "__init__.py").exists():
        sys.exit(f"--baseline-tree {base}: no gpusched package there")
    trees: dict[str, Path | None] = {"this tree": None}
    if base is not None:
        trees["baseline tree"] = base
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    floor_rounds: list[float] = []
    service = None if args.no_cgroup else scratch_cgroup("gpusched-bench")
    floor_cgroup = None if service is None else scratch_cgroup("gpusched-floor")
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        # `python -m gpusched` puts the working directory first on sys.path, before
        # PYTHONPATH: run from a checkout, every tree's daemon would be that checkout's.
        os.chdir(root)
        for name, tree in trees.items():
            print(f"  {name}'s daemon runs {package_dir(tree)}")
        (root / "floor").mkdir()
        floor = Floor(root / "floor", floor_cgroup)
        try:
            for round_no in range(args.rounds):
                order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
                for name in order:
                    where = root / f"gpusched-{round_no}-{name.split()[0]}"
                    where.mkdir()
                    service_path = None if service is None else service.path
                    runs[name].append(bench_gpusched(args.jobs, where, trees[name], service_path))
                    if not runs[name][-1]["job_cgroups"]:
                        floor.cgroup_parent = None  # the daemon made none: not in the floor
                before = {k: len(v) for k, v in floor.samples.items()}
                floor.measure(args.floor_samples)
                floor_rounds.append(
                    sum(statistics.median(v[before.get(k, 0) :]) for k, v in floor.samples.items())
                )
            (root / "tsp").mkdir()
            theirs = bench_tsp(tsp, args.jobs, root / "tsp")
            alone = {
                name: supervisor_alone(root / "floor", tree=tree) for name, tree in trees.items()
            }
        finally:
            floor.close()
            for made in (service, floor_cgroup):
                if made is not None:
                    remove_cgroup_tree(made)
    steps = floor.medians()
    floor_s = sum(steps.values())
    n = args.jobs
    print(f"{n} `true` jobs through one slot, after a blocker holding it is released;")
    print(f"{args.rounds} rounds, each: every tree's daemon (ABBA order), then the floor")
    cgroup_words = (
        "a memory cgroup of its own (one per job)" if service else "the benchmark's cgroup"
    )
    print(f"  each daemon runs in {cgroup_words}")
    medians: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        medians[name] = {k: statistics.median(r[k] for r in results) for k in results[0]}
        ours = medians[name]
        per_round = ", ".join(
            f"{1e3 * r['per_job_s']:.1f} ({r['per_job_s'] / f:.1f}x)"
            for r, f in zip(results, floor_rounds, strict=True)
        )
        print(f"  gpusched, {name}: per job, each round (x that round's floor): {per_round}")
        print(
            f"    median {_ms(ours['per_job_s'])} per job; started->ended"
            f" {_ms(ours['run_median_s'])}, ended->next started {_ms(ours['gap_median_s'])};"
            f" submit {_ms(ours['submit_per_job_s'])}"
        )
        print(
            f"    CPU per job: whole machine {_ms(ours['cpu_per_job_s'])}, daemon"
            f" {_ms(ours['daemon_cpu_per_job_s'])}, zygote + supervisors + jobs"
            f" {_ms(ours['job_side_cpu_per_job_s'])}"
        )
        print(
            f"    one supervisor alone (forked as the zygote does, runs `true`):"
            f" {_ms(alone[name]['wall_s'])}, {_ms(alone[name]['cpu_s'])} CPU,"
            f" {alone[name]['faults']:.0f} page faults"
        )
    print(f"  task-spooler ({tsp}): {_ms(theirs['per_job_s'])} per job (keeps nothing on disk)")
    print(f"  the floor, step by step (medians of {args.floor_samples} per round, no scheduler):")
    for name, seconds in steps.items():
        print(f"    {name:<62} {1e3 * seconds:.3f} ms")
    for name, why in floor.skipped.items():
        print(f"    {name:<62} not counted: {why}")
    per_round_floor = ", ".join(f"{1e3 * f:.2f}" for f in floor_rounds)
    print(f"    {'together':<62} {1e3 * floor_s:.3f} ms (each round: {per_round_floor} ms)")
    ratio = statistics.median(
        r["per_job_s"] / f for r, f in zip(runs["this tree"], floor_rounds, strict=True)
    )
    # The floor times the cgroup move cold, as each job met it; the daemon now starts its
    # grace period early, so the same floor with that step warm says what is left.
    cgroup_step = "cgroup: made, entered and left, OOM kills read, removed"
    warm_floor_s = floor_s
    if floor.warm_cgroup and cgroup_step in steps:
        warm_floor_s += statistics.median(floor.warm_cgroup) - steps[cgroup_step]
        print(
            f"    {'the cgroup step right after another move (lock warm)':<62}"
            f" {1e3 * statistics.median(floor.warm_cgroup):.3f} ms: with it, the floor is"
            f" {1e3 * warm_floor_s:.3f} ms and gpusched"
            f" {medians['this tree']['per_job_s'] / warm_floor_s:.2f}x that"
        )
    figures = [
        Figure("gpusched per job (this tree)", 1e3 * medians["this tree"]["per_job_s"], "ms"),
        Figure("floor: every per-job step, together", 1e3 * floor_s, "ms"),
        Figure("gpusched / floor (median of rounds)", ratio, "x", "<= 2", ratio <= 2),
        Figure(
            "gpusched / floor with its cgroup step warm",
            medians["this tree"]["per_job_s"] / warm_floor_s,
            "x",
        ),
        *[Figure(f"floor: {name}", 1e3 * seconds, "ms") for name, seconds in steps.items()],
        Figure(
            "gpusched run (started->ended), median",
            1e3 * medians["this tree"]["run_median_s"],
            "ms",
        ),
        Figure(
            "gpusched gap (ended->next started), median",
            1e3 * medians["this tree"]["gap_median_s"],
            "ms",
        ),
        Figure(
            "gpusched daemon CPU per job", 1e3 * medians["this tree"]["daemon_cpu_per_job_s"], "ms"
        ),
        Figure(
            "one supervisor alone, forked, running `true`", 1e3 * alone["this tree"]["wall_s"], "ms"
        ),
        Figure("task-spooler per job", 1e3 * theirs["per_job_s"], "ms"),
    ]
    if base is not None:
        base_ratio = statistics.median(
            r["per_job_s"] / f for r, f in zip(runs["baseline tree"], floor_rounds, strict=True)
        )
        figures += [
            Figure(
                "gpusched per job (baseline tree)",
                1e3 * medians["baseline tree"]["per_job_s"],
                "ms",
            ),
            Figure("baseline tree / floor (median of rounds)", base_ratio, "x"),
        ]
    report("dispatch", figures)


if __name__ == "__main__":
    main()
