"""What the fault tests check, Jepsen-style: a history of what really ran, then rules on it.

Each job of a fault test runs `RECORDER` (`recorded_job(...)` gives its command line): it
appends a `start` line to a shared JSON-lines file when its process starts, and an `end`
line when it finishes, each with the job's id, the node whose daemon started it (found
from its supervisor's command line, which holds that daemon's state directory), its GPUs
and the time (CLOCK_MONOTONIC: every daemon of a test runs on this machine, so times
compare). The checkers read that history, and the database for what the cluster says:

- `double_starts`: a job whose process started more than once (only `--requeue` may).
- `overcommit`: a card whose jobs' declared memory summed over its size at some instant.
- `lost_but_ended`: a job that ran to its end but that the database keeps `lost`.
- `starts_between`: the starts in a window, by node (liveness during a partition).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpusched.store import Store

RECORDER = """\
import json, os, sys, time
log, root, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])

def node():
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            break
        if root in cmdline:
            return cmdline.split(root, 1)[1].lstrip("/").split("/", 1)[0]
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return "?"

record = {
    "job": int(os.environ["GPUSCHED_JOB_ID"]),
    "node": node(),
    "gpus": [g for g in os.environ.get("GPUSCHED_GPU_UUIDS", "").split(",") if g],
}

def say(event):
    line = json.dumps({**record, "event": event, "t": time.monotonic()}) + "\\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of one short line: never interleaved
    finally:
        os.close(fd)

say("start")
time.sleep(seconds)
say("end")
"""


@dataclass(frozen=True)
class Run:
    job: int
    node: str
    gpus: tuple[str, ...]
    start: float
    end: float | None  # None: still running, or killed before its end


class History:
    def __init__(self, root: Path) -> None:
        """`root`: the directory holding every daemon's (tmp_path: daemons are root/NAME)."""
        self.root = root
        self.log = root / "runs.jsonl"
        self.script = root / "recorder.py"
        self.script.write_text(RECORDER)

    def job(self, seconds: float) -> list[str]:
        """The command line of a recorded job that runs `seconds`."""
        return [sys.executable, str(self.script), str(self.log), str(self.root), str(seconds)]

    def runs(self) -> list[Run]:
        if not self.log.exists():
            return []
        started: dict[tuple[int, str], list[dict[str, object]]] = defaultdict(list)
        ended: dict[tuple[int, str], list[float]] = defaultdict(list)
        for line in self.log.read_text().splitlines():
            rec = json.loads(line)
            key = (int(rec["job"]), str(rec["node"]))
            if rec["event"] == "start":
                started[key].append(rec)
            else:
                ended[key].append(float(rec["t"]))
        runs = []
        for key, starts in started.items():
            ends = sorted(ended.get(key, []))
            for rec in sorted(starts, key=lambda r: float(str(r["t"]))):
                start = float(str(rec["t"]))
                end = next((t for t in ends if t >= start), None)
                if end is not None:
                    ends.remove(end)
                gpus = rec["gpus"]
                assert isinstance(gpus, list)
                runs.append(Run(key[0], key[1], tuple(str(g) for g in gpus), start, end))
        return runs

    # -- the checkers -------------------------------------------------------------------------

    def double_starts(self, requeue: frozenset[int] | set[int] = frozenset()) -> dict[int, int]:
        """{job: times started} for each job started more than once without --requeue."""
        counts = Counter(run.job for run in self.runs())
        return {job: n for job, n in counts.items() if n > 1 and job not in requeue}

    def overcommit(self, declared: dict[int, float], card_size: float) -> list[str]:
        """Each card (node, GPU) whose running jobs' declared memory exceeded its size."""
        events: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for run in self.runs():
            for gpu in run.gpus:
                mem = declared[run.job]
                events[(run.node, gpu)].append((run.start, mem))
                events[(run.node, gpu)].append((run.end if run.end is not None else 1e18, -mem))
        found = []
        for card, changes in events.items():
            held = 0.0
            for at, change in sorted(changes, key=lambda e: (e[0], e[1])):  # ends first
                held += change
                if held > card_size + 1e-9:
                    found.append(f"{card[0]} {card[1]}: {held:g} declared at t={at:.2f}")
                    break
        return found

    def lost_but_ended(self, store: Store) -> list[int]:
        """Jobs that ran to their end (and were not started again) but the database says lost."""
        ended = {run.job for run in self.runs() if run.end is not None}
        return sorted(job for job in ended if store.jobs.get(job).state.value == "lost")

    def starts_between(self, since: float, until: float) -> dict[str, int]:
        """{node: starts} of the runs that began in [since, until)."""
        return dict(Counter(run.node for run in self.runs() if since <= run.start < until))
