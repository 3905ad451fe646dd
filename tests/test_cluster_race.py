"""Three daemons race over one queue of many short jobs (docs/cluster.md): each job runs
exactly once, and no GPU ever holds more declared memory than it can give.

200 jobs here, on the shared PostgreSQL and on a shared SQLite file; the soak's 1,000
(minutes) are `python benchmarks/soaks.py`. `CLUSTER_RACE_JOBS` sets another count."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from gpusched.core.models import Job
from gpusched.store import Store
from tests.daemon_harness import RunningDaemon, eventually

GIB = 2**30
JOB_MEM = 4 * GIB
USABLE = 24 * GIB - 512 * 2**20  # a simulated 24G card less the default headroom


def _overcommitted(jobs: list[Job]) -> list[str]:
    """Moments at which a card held more declared memory than it can give."""
    events: dict[tuple[str, str], list[tuple[datetime, int]]] = defaultdict(list)
    for job in jobs:
        assert job.started_at and job.ended_at and job.node, job
        for uuid in job.gpu_uuids:
            events[(job.node, uuid)].append((datetime.fromisoformat(job.started_at), JOB_MEM))
            events[(job.node, uuid)].append((datetime.fromisoformat(job.ended_at), -JOB_MEM))
    found = []
    for card, moments in events.items():
        held = 0
        for moment, change in sorted(moments, key=lambda m: (m[0], m[1])):  # ends first
            held += change
            if held > USABLE:
                found.append(f"{card} held {held / GIB:.0f}G at {moment}")
    return found


def race(node: Callable[..., RunningDaemon], tmp_path: Path, count: int, shared: str) -> float:
    daemons = [node(name) for name in ("a", "b", "c")]
    runs = tmp_path / "runs"
    code = (
        f"import os\nwith open({str(runs)!r}, 'a') as f:"
        " f.write(os.environ['GPUSCHED_JOB_ID'] + '\\n')"
    )
    values = ",".join(str(i) for i in range(count))
    began = time.monotonic()
    submitted = daemons[0].cli(
        "submit", "--mem", "4G", "--sweep", f"i={values}", "--", sys.executable, "-c", code, "{i}"
    )
    assert submitted.returncode == 0, submitted.stderr
    ids = [int(line) for line in submitted.stdout.split()]
    assert len(ids) == count
    store = Store(shared)
    try:

        def all_done() -> bool:
            return not store.jobs.count_active_by_user()  # no user has an active job

        eventually(
            all_done, 60 + count * 0.5, interval=0.5, describe=store.jobs.count_active_by_user
        )
        took = time.monotonic() - began
        jobs = list(store.jobs.iter_jobs(ids))
    finally:
        store.close()
    assert [j.state for j in jobs] == ["done"] * count, [
        j.to_json() for j in jobs if j.state != "done"
    ][:3]
    ran = runs.read_text().split()
    assert sorted(map(int, ran)) == sorted(ids)  # each exactly once
    assert _overcommitted(jobs) == []
    assert {j.node for j in jobs} == {"a", "b", "c"}  # every node took some
    for daemon in daemons:
        assert "Traceback" not in daemon.stderr()
    return took


def test_three_daemons_run_each_of_many_jobs_once(
    node: Callable[..., RunningDaemon],
    tmp_path: Path,
    shared_db: str,
) -> None:
    count = int(os.environ.get("CLUSTER_RACE_JOBS", "200"))
    took = race(node, tmp_path, count, shared_db)
    print(f"{count} jobs on 3 daemons: {took:.1f} s")
