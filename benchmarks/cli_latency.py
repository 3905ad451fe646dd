"""CLI latency: `gpusched status`, `submit` and `show` with 10,000 ended jobs in the database.

The database is filled before the daemon starts, through `gpusched.store.Store` (its
engine and its `jobs` table, in one transaction: 10,000 ended jobs, each with this
process's real environment as a submitted job carries it). Then each command is timed
as a fresh process against the running daemon, beside `python -c pass` on the same
interpreter in the same run: median of RUNS runs each, with hyperfine when it is
installed (apt-get install hyperfine), else a Python timing loop. Each timed run
follows an untimed 0.5 s pause, so a submit is timed on an idle daemon and not while
the previous run's job is being launched (on 2 cores that launch, a Python supervisor
starting, competes with the CLI); submits back to back, as a shell loop makes them,
are timed too and reported beside.

Both sides run the interpreter gpusched is installed into, directly (the `gpusched`
console script next to `sys.executable`, and `sys.executable -c pass`), never through
a version-manager shim, which would add its own start-up to both.
The CLI finds the daemon through GPUSCHED_SOCKET, as a user's shell would with the
socket in its default place (no config file to parse); `status` with GPUSCHED_CONFIG
instead (the config's socket read on every call, as root's commands read
/etc/gpusched/config.yaml) is reported beside it, the baseline tree's too.

Each command is also timed through the click group alone (gpusched/cli/group.py, the
path before cli/fast.py and still the path of every form it leaves to click), in the same
rounds: the before and after of the fast path in one run.

With --baseline-tree DIR (a checkout of an earlier commit, e.g. from `git archive`), each
command is also timed as that tree's `gpusched` runs it (its `main()`, DIR first on
sys.path), in the same rounds: an earlier fast path's before and after in one run.

Where the time goes is printed too: `python -X importtime` of one `gpusched status`,
`show` and `submit` (the imports that took longest, cumulative) and `import
gpusched.cli.fast` beside `import gpusched.cli.group`, best of 3. Whether this
interpreter's gpusched is an editable install is said, since the editable finder adds its
own start-up to both sides.

    python benchmarks/cli_latency.py [--runs 30] [--ended 10000] [--baseline-tree DIR]
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
from pathlib import Path

from _common import Figure, print_conditions, report

from gpusched.store import Store, jobs
from tests.daemon_harness import RunningDaemon

PAUSE_S = 0.5  # between timed runs: a submitted `true` job is launched and over by then
TARGET_RATIO = 2.0  # issue 30: each command at most 2x `python -c pass`
IMPORTTIME_LINES = 15
# The same command line through the click group alone (the path before cli/fast.py, and
# still the path of every form it leaves to click), on the same interpreter.
CLICK_ONLY = "import sys; from gpusched.cli.group import cli; cli(prog_name='gpusched')"
# The `gpusched` script of another tree (--baseline-tree), on the same interpreter.
TREE_MAIN = "import sys; sys.path.insert(0, {tree!r}); from gpusched.cli import main; main()"


def import_profile(command: list[str], env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) of each import one run of `command` made."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, module = line.removeprefix("import time:").split("|")
        rows.append((int(own), int(cumulative), module.rstrip()))
    return rows


def import_ms(module: str, env: dict[str, str]) -> float:
    """`import MODULE` alone, best of 3, as -X importtime reports it."""
    best = []
    for _ in range(3):
        rows = import_profile(["-c", f"import {module}"], env)
        best.append(next(c for _, c, m in rows if m.strip() == module) / 1e3)
    return min(best)


def editable_install() -> bool:
    import gpusched

    return not Path(gpusched.__file__).resolve().is_relative_to(Path(sys.prefix).resolve() / "lib")


def fill_history(database_url: str, n_ended: int, cwd: str) -> None:
    """n_ended jobs that ran and ended, as a busy server's history holds them."""
    store = Store(database_url)
    env = dict(os.environ)
    states = ("done", "done", "done", "failed", "cancelled")
    rows = []
    for i in range(n_ended):
        state = states[i % len(states)]
        minute, second = divmod(i % 3600, 60)
        day = f"2026-11-{1 + i // 3600 % 20:02d}"
        rows.append(
            {
                "name": f"sweep-{i}" if i % 3 == 0 else None,
                "user": "bench",
                "uid": os.getuid(),
                "gid": os.getgid(),
                "state": state,
                "command": ["python", "train.py", "--lr", f"0.{i % 97:03d}"],
                "cwd": cwd,
                "env": env,
                "umask": 0o022,
                "mem": (2 + i % 39) * 2**30,
                "gpus": 1,
                "gpu_indices": [i % 4],
                "gpu_uuids": [f"GPU-5a5a5a5a-0000-4000-8000-{i % 4:012d}"],
                "priority": 0,
                "after": [],
                "submitted_at": f"{day}T10:{minute:02d}:{second:02d}.000+00:00",
                "started_at": f"{day}T11:{minute:02d}:{second:02d}.000+00:00",
                "ended_at": f"{day}T12:{minute:02d}:{second:02d}.000+00:00",
                "pid": 10_000 + i,
                "exit_code": 0 if state == "done" else 1,
                "reason": "cancelled" if state == "cancelled" else "exit",
                "peak_mem": (1 + i % 30) * 2**30,
                "hints": [],
            }
        )
    with store.database.engine.begin() as conn:
        conn.execute(jobs.insert(), rows)
    assert store.jobs.count() == n_ended
    store.close()


def time_commands(
    commands: dict[str, list[str]], env: dict[str, str], runs: int, pause_s: float = 0.0
) -> dict[str, float]:
    """Median wall time in seconds of each command (a fresh process per run).

    pause_s: an untimed pause before every run, so that what a run started in the
    daemon (a submitted job's launch) is over before the next run is timed.
    """
    hyperfine = shutil.which("hyperfine")
    if hyperfine:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "hyperfine.json"
            argv = [
                hyperfine,
                "-N",
                "--warmup",
                "3",
                "--runs",
                str(runs),
                "--export-json",
                str(out),
            ]
            if pause_s:
                argv += ["--prepare", f"sleep {pause_s}"]
            for name, command in commands.items():
                argv += ["-n", name, subprocess.list2cmdline(command)]
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            results = json.loads(out.read_text())["results"]
        return {r["command"]: statistics.median(r["times"]) for r in results}
    # Interleaved, one run of each command per round: a change in the machine's load
    # falls on every command alike, so the ratios stay comparable on a shared machine.
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(runs + 3):
        for name, command in commands.items():
            time.sleep(pause_s)
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
            if i >= 3:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--ended", type=int, default=10_000)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also time this tree's gpusched (an earlier commit's checkout) in the same rounds",
    )
    args = parser.parse_args()
    tree = None if args.baseline_tree is None else str(args.baseline_tree.resolve())
    if tree is not None and not Path(tree, "gpusched", "cli", "__init__.py").exists():
        sys.exit(f"--baseline-tree {tree}: no gpusched package there")
    print_conditions()
    script = Path(sys.executable).with_name("gpusched")
    if not script.exists():
        sys.exit(f"no gpusched console script next to {sys.executable}: pip install -e .")
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        daemon = RunningDaemon(root, simulate="4x80G")
        began = time.perf_counter()
        fill_history(f"sqlite:///{root / 'gpusched.db'}", args.ended, str(root))
        print(f"{args.ended} ended jobs written in {time.perf_counter() - began:.1f} s")
        daemon.start()
        try:
            env = {k: v for k, v in daemon.env.items() if k != "GPUSCHED_CONFIG"}
            env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
            with_config = {**daemon.env}
            shown_id = subprocess.run(
                [str(script), "submit", "--mem", "1G", "--", "true"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[0]
            timed = {
                "status": ["status"],
                "submit": ["submit", "--mem", "1G", "--", "true"],
                "show": ["show", shown_id],
            }
            commands = {"python -c pass": [sys.executable, "-c", "pass"]}
            for name, args_of in timed.items():
                commands[f"gpusched {name}"] = [str(script), *args_of]
                commands[f"gpusched {name} (click)"] = [sys.executable, "-c", CLICK_ONLY, *args_of]
                if tree is not None:
                    main_of_tree = TREE_MAIN.format(tree=tree)
                    commands[f"gpusched {name} (baseline)"] = [
                        sys.executable,
                        "-c",
                        main_of_tree,
                        *args_of,
                    ]
            profiles = {
                name: import_profile([str(script), *args_of], env)
                for name, args_of in timed.items()
            }
            fast_import_ms = import_ms("gpusched.cli.fast", env)
            click_import_ms = import_ms("gpusched.cli.group", env)
            medians = time_commands(commands, env, args.runs, pause_s=PAUSE_S)
            configured = {"gpusched status (config file)": [str(script), "status"]}
            if tree is not None:
                configured["gpusched status (config file, baseline)"] = [
                    sys.executable,
                    "-c",
                    TREE_MAIN.format(tree=tree),
                    "status",
                ]
            medians.update(time_commands(configured, with_config, args.runs, pause_s=PAUSE_S))
            back_to_back = time_commands(
                {"gpusched submit, back to back": commands["gpusched submit"]}, env, args.runs
            )
            medians.update(back_to_back)
        finally:
            daemon.stop()
            daemon.kill_jobs()
        store = Store(f"sqlite:///{root / 'gpusched.db'}")
        history = store.jobs.count()
        store.close()
    base = medians["python -c pass"]
    how = "hyperfine" if shutil.which("hyperfine") else "interleaved loop"
    print(f"medians of {args.runs} runs ({how}):")
    for name, value in medians.items():
        print(f"  {name:<34} {1e3 * value:7.1f} ms  {value / base:5.2f}x python -c pass")
    print(f"  jobs in the database at the end: {history} (the ended ones plus the timed submits)")
    for name, profile in profiles.items():
        total = sum(own for own, _, _ in profile) / 1e3
        print(
            f"python -X importtime of one `gpusched {name}`: {len(profile)} imports,"
            f" {total:.1f} ms in all; the {IMPORTTIME_LINES} longest:"
        )
        print(f"  {'self ms':>8} {'cumul. ms':>9}  module")
        for own, cumulative, module in sorted(profile, key=lambda r: -r[1])[:IMPORTTIME_LINES]:
            print(f"  {own / 1e3:8.1f} {cumulative / 1e3:9.1f}  {module}")
    install = "editable" if editable_install() else "non-editable"
    print(
        f"import, best of 3 ({install} install): gpusched.cli.fast {fast_import_ms:.1f} ms,"
        f" gpusched.cli.group (the click group) {click_import_ms:.1f} ms"
    )
    figures = [Figure("python -c pass (baseline)", 1e3 * base, "ms")]
    for name in ("gpusched status", "gpusched submit", "gpusched show"):
        ratio = medians[name] / base
        click_ratio = medians[f"{name} (click)"] / base
        if f"{name} (baseline)" in medians:
            baseline_ratio = medians[f"{name} (baseline)"] / base
            figures.append(Figure(f"{name}, baseline tree / python -c pass", baseline_ratio, "x"))
        figures += [
            Figure(f"{name} through click alone / python -c pass", click_ratio, "x"),
            Figure(name, 1e3 * medians[name], "ms"),
            Figure(
                f"{name} / python -c pass",
                ratio,
                "x",
                f"<= {TARGET_RATIO:g}",
                ratio <= TARGET_RATIO,
            ),
        ]
    figures.append(Figure(f"import gpusched.cli.fast, best of 3 ({install})", fast_import_ms, "ms"))
    figures.append(Figure("import gpusched.cli.group (click), best of 3", click_import_ms, "ms"))
    for name in (
        "gpusched status (config file)",
        "gpusched status (config file, baseline)",
        "gpusched submit, back to back",
    ):
        if name in medians:
            figures.append(Figure(f"{name} / python -c pass", medians[name] / base, "x"))
    figures.append(Figure("jobs in the database at the end", history, "jobs"))
    report("cli_latency", figures)


if __name__ == "__main__":
    main()
