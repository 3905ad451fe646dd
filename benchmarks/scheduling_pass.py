"""One scheduling pass: `plan()` with 10,000 waiting jobs on 64 GPUs, and a whole `tick()`.

The GPUs are 64 x 80 GB, each already running 3 jobs of the packing benchmark's trace
(so most waiting jobs do not fit: a long queue on a full server, the worst case for
`plan()`, which then explains why each job waits and picks the head's GPUs to keep).
The 10,000 waiting jobs have the same generator's declared sizes. `plan()` is timed
alone (median of RUNS); baseline in the same run: sorting the same 10,000 waiting jobs
by (-priority, id), which any pass must do.

Then a real `Scheduler` (SQLite store in a temp dir, `SimulatedProbe` with the same 64
GPUs, a real `Launcher`) with the same jobs in its database, all running jobs holding
whole GPUs, so no job can start and nothing is launched; one `tick()` is timed (median
of TICK_BLOCKS x TICK_BLOCK, in blocks alternated with its baseline's: the machine's
speed drifts): read GPUs, load every active job, settle dependencies, plan. The same
tick with SMALL_QUEUE waiting jobs is its baseline (issue 30: a queue of 10,000 costs one
tick at most 3x a queue of 100).

    python benchmarks/scheduling_pass.py [--waiting 10000] [--gpus 64]
    python benchmarks/scheduling_pass.py --baseline-tree DIR [--rounds 2]

With --baseline-tree DIR (a checkout of an earlier commit, e.g. from `git archive`), the
whole benchmark runs as that tree's gpusched runs it (DIR first on PYTHONPATH) and as this
tree's, each in its own process, alternated for --rounds rounds: before and after in the
same run, on the same machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import RESULT_PREFIX, Figure, GiB, median_time, print_conditions, report
from _packing_trace import TraceJob, make_trace

from gpusched.scheduling.policy import GpuSlot, RunningClaim, WaitingJob, plan
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import jobs
from tests.daemon_harness import in_process_scheduler

RUNS = 20
TICK_BLOCKS = 4
TICK_BLOCK = 5
PER_GPU = 3
HEADROOM = 512 * 2**20
SMALL_QUEUE = 100
TICK_RATIO_TARGET = 3.0


def sized_trace(seed: int, n_jobs: int, window_s: float) -> list[TraceJob]:
    """The packing benchmark's lab trace, every job declaring --mem (a whole-GPU job, its peak)."""
    return [
        replace(j, declared_bytes=j.declared_bytes or j.peak_bytes)
        for j in make_trace(seed, n_jobs, window_s, "lab")
    ]


def policy_input(
    n_waiting: int, n_gpus: int
) -> tuple[list[GpuSlot], list[RunningClaim], list[WaitingJob]]:
    trace = sized_trace(7, n_waiting + n_gpus * PER_GPU, 3600.0)
    gpus, running = [], []
    for g in range(n_gpus):
        uuid = f"GPU-bench-{g:03d}"
        on_gpu = trace[g * PER_GPU : (g + 1) * PER_GPU]
        used = sum(j.peak_bytes for j in on_gpu)
        gpus.append(GpuSlot(uuid, g, 80 * GiB, 80 * GiB - used))
        running += [
            RunningClaim(j.job_id, (uuid,), j.declared_bytes, {uuid: j.peak_bytes}) for j in on_gpu
        ]
    rest = trace[n_gpus * PER_GPU :]
    waiting = [WaitingJob(100_000 + i, j.declared_bytes) for i, j in enumerate(rest)]
    return gpus, running, waiting


@contextlib.contextmanager
def loaded_scheduler(n_waiting: int, n_gpus: int, root: Path) -> Iterator[Scheduler]:
    """A real Scheduler whose every GPU a running job holds whole, `n_waiting` queued."""
    root.mkdir(parents=True, exist_ok=True)
    scheduler = in_process_scheduler(root, f"{n_gpus}x80G")
    store = scheduler.store
    uuids = [g.uuid for g in scheduler.context.probe.snapshot()]
    trace = sized_trace(7, n_waiting, 3600.0)
    env = dict(os.environ)
    base = {"user": "bench", "uid": os.getuid(), "gid": os.getgid(), "cwd": str(root)}
    # Bulk load in one transaction (store.jobs.add commits one row at a time, with fsync).
    rows = [
        {
            **base,
            "state": "running",
            "command": ["sleep", "3600"],
            "env": env,
            "umask": 0o022,
            "mem": None,
            "gpus": 1,
            "gpu_indices": [g],
            "gpu_uuids": [uuids[g]],
            "priority": 0,
            "after": [],
            "submitted_at": "2026-11-21T00:00:00.000+00:00",
            "started_at": "2026-11-21T00:00:01.000+00:00",
            "hints": [],
        }
        for g in range(n_gpus)
    ]
    queued = [
        {
            **base,
            "state": "queued",
            "command": ["python", "train.py", f"--seed={j.job_id}"],
            "env": env,
            "umask": 0o022,
            "mem": j.declared_bytes,
            "gpus": 1,
            "gpu_indices": [],
            "gpu_uuids": [],
            "priority": 0,
            "after": [],
            "submitted_at": "2026-11-21T00:00:02.000+00:00",
            "hints": [],
        }
        for j in trace
    ]
    with store.database.engine.begin() as conn:  # one statement per row shape
        conn.execute(jobs.insert(), rows)
        conn.execute(jobs.insert(), queued)
    logging.getLogger("gpusched").setLevel(logging.WARNING)
    try:
        yield scheduler
    finally:
        scheduler.context.launcher.close()
        store.close()


def interleaved_ticks(
    schedulers: dict[str, Scheduler], blocks: int
) -> dict[str, tuple[float, float, int]]:
    """Each scheduler's tick, (median wall s, median CPU s, jobs given a reason), timed in
    blocks of TICK_BLOCK ticks, the schedulers' blocks alternated. The machine's speed
    drifts over seconds (a shared VM: the same tick's CPU time moved 2x within a minute
    here), so a ratio of two figures taken one after the other carries that drift; ticks
    alternated one by one would instead evict each other's caches."""
    for tick in [s.tick for s in schedulers.values()] * 2:  # warm-up, untimed
        tick()
    walls: dict[str, list[float]] = {name: [] for name in schedulers}
    cpus: dict[str, list[float]] = {name: [] for name in schedulers}
    for _ in range(blocks):
        for name, scheduler in schedulers.items():
            scheduler.tick()  # its caches back, untimed
            for _ in range(TICK_BLOCK):
                wall, cpu = time.perf_counter(), time.process_time()
                scheduler.tick()
                cpus[name].append(time.process_time() - cpu)
                walls[name].append(time.perf_counter() - wall)
    result = {}
    for name, scheduler in schedulers.items():
        plan_now = scheduler.tick()
        assert not plan_now.placements, "the benchmark must not launch anything"
        result[name] = (
            statistics.median(walls[name]),
            statistics.median(cpus[name]),
            len(plan_now.waiting_reasons),
        )
    return result


def one_run(args: argparse.Namespace, tree: str | None) -> dict[str, dict[str, Any]]:
    """This benchmark in a process of its own, as `tree`'s gpusched (None: this tree's)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    # This benchmark, so that both trees are measured alike; where this one's helpers need
    # names that tree's gpusched lacks, that tree's own copy of it.
    scripts = [Path(__file__)]
    if tree is not None and Path(tree, "benchmarks", "scheduling_pass.py").exists():
        scripts.append(Path(tree, "benchmarks", "scheduling_pass.py"))
    for script in scripts:
        command = [sys.executable, str(script), "--waiting", str(args.waiting)]
        command += ["--gpus", str(args.gpus), *(["--no-tick"] if args.no_tick else [])]
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=False,  # a missed target exits 1: its figures are what is wanted here
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if lines:
            break
    else:
        sys.exit(f"{' '.join(command)} (tree {tree or 'this'}) gave no figures:\n{done.stderr}")
    line = lines[0]
    figures = json.loads(line.removeprefix(RESULT_PREFIX))["figures"]
    return {f["name"]: f for f in figures}


def against_baseline(args: argparse.Namespace) -> None:
    tree = str(args.baseline_tree.resolve())
    if not Path(tree, "gpusched", "scheduling").is_dir():
        sys.exit(f"--baseline-tree {tree}: no gpusched package there")
    print_conditions()
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {"baseline tree": [], "this tree": []}
    for round_no in range(1, args.rounds + 1):
        for label, where in (("baseline tree", tree), ("this tree", None)):
            runs[label].append(one_run(args, where))
            print(f"round {round_no}, {label}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    names = list(runs["this tree"][0])
    print(f"\n{'each round':52} " + "  ".join(f"{label:>24}" for label in runs))
    for name in names:
        cells = [" ".join(f"{r[name]['value']:11.2f}" for r in runs[label]) for label in runs]
        print(f"{name:52} " + "  ".join(f"{c:>24}" for c in cells))
    figures = []
    for label, results in runs.items():
        for name in names:
            value = statistics.median(r[name]["value"] for r in results)
            target, unit = results[0][name]["target"], results[0][name]["unit"]
            ok = None if target is None else all(r[name]["ok"] for r in results)
            figures.append(Figure(f"{label}: {name}", value, unit, target, ok))
    report("scheduling_pass", figures, {"rounds": args.rounds, "baseline_tree": tree})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--no-tick", action="store_true", help="time plan() only")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run this benchmark as that tree's gpusched (an earlier commit's checkout),"
        " alternated with this tree's",
    )
    parser.add_argument("--rounds", type=int, default=2, help="with --baseline-tree")
    args = parser.parse_args()
    if args.baseline_tree is not None:
        against_baseline(args)
        return
    print_conditions()
    gpus, running, waiting = policy_input(args.waiting, args.gpus)
    seconds, _ = median_time(lambda: plan(gpus, running, waiting, HEADROOM), RUNS)
    result = plan(gpus, running, waiting, HEADROOM)
    sort_s, _ = median_time(lambda: sorted(waiting, key=lambda j: (-j.priority, j.job_id)), RUNS)
    print(
        f"plan(): {args.waiting} waiting, {args.gpus} GPUs, {len(running)} running:"
        f" {1e3 * seconds:.1f} ms (median of {RUNS});"
        f" {len(result.placements)} placed, {len(result.waiting_reasons)} waiting"
    )
    print(f"  baseline, sorting the waiting jobs: {1e3 * sort_s:.2f} ms")
    figures = [
        Figure("plan(), 10,000 waiting x 64 GPUs", 1e3 * seconds, "ms", "< 20", seconds < 0.020),
        Figure("plan() / sorting the queue", seconds / sort_s, "x"),
    ]
    if not args.no_tick:
        with (
            tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp,
            loaded_scheduler(args.waiting, args.gpus, Path(tmp, "long")) as long,
            loaded_scheduler(SMALL_QUEUE, args.gpus, Path(tmp, "short")) as short,
        ):
            ticks = interleaved_ticks({"long": long, "short": short}, TICK_BLOCKS)
        (tick_s, tick_cpu, reasons), (small_s, small_cpu, small_reasons) = ticks.values()
        print(
            f"Scheduler.tick(): {1e3 * tick_s:.1f} ms wall, {1e3 * tick_cpu:.1f} ms CPU"
            f" (medians of {TICK_BLOCKS * TICK_BLOCK}, in blocks alternated with the baseline's),"
            f" {reasons} waiting"
        )
        print(
            f"  baseline, {SMALL_QUEUE} waiting: {1e3 * small_s:.1f} ms wall,"
            f" {1e3 * small_cpu:.1f} ms CPU, {small_reasons} waiting"
        )
        ratio = tick_s / small_s
        figures += [
            Figure("Scheduler.tick(), same queue, SQLite", 1e3 * tick_s, "ms"),
            Figure(f"Scheduler.tick(), {SMALL_QUEUE} waiting", 1e3 * small_s, "ms"),
            Figure(
                f"tick() CPU, {args.waiting} / {SMALL_QUEUE} waiting", tick_cpu / small_cpu, "x"
            ),
            Figure(
                f"tick(), {args.waiting} / {SMALL_QUEUE} waiting",
                ratio,
                "x",
                f"<= {TICK_RATIO_TARGET:g}",
                ratio <= TICK_RATIO_TARGET,
            ),
        ]
    report("scheduling_pass", figures)


if __name__ == "__main__":
    main()
