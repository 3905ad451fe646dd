"""The cgroup move warmer (gpusched.processes.move_warmer) on a real memory cgroup.

Its point is speed (a job's cgroup move finds the kernel's lock warm: benchmarks/
dispatch.py); what a test can hold it to is that the move it makes changes nothing (the
daemon stays in its cgroup, with all its threads), that it is made, and that a warmer
whose cgroup went away stops quietly instead of taking the daemon down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.processes import cgroups
from gpusched.processes.move_warmer import MoveWarmer

CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from pathlib import Path
    from gpusched.processes import cgroups
    from gpusched.processes.move_warmer import MoveWarmer

    cgroup = Path(sys.argv[1])
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    other = threading.Thread(target=time.sleep, args=(3,), daemon=True)
    other.start()  # a second thread: the move takes the whole process
    warmer = MoveWarmer(cgroup)
    for _ in range(3):
        warmer.warm()
    deadline = time.monotonic() + 20
    while warmer.moves < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    warmer.close()
    where = {
        tid: cgroups.own_memory_cgroup(f"self/task/{tid}")
        for tid in (threading.get_native_id(), other.native_id)
    }
    print(warmer.moves, all(c is not None and c.path == cgroup for c in where.values()))
    """
)


@pytest.fixture
def scratch_cgroup() -> Iterator[Path]:
    """A new memory cgroup under this process's own, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a memory cgroup of its own)")
    own = cgroups.own_memory_cgroup()
    if own is None:
        pytest.skip("no memory cgroup on this machine")
    path = own.path / f"gpusched-test-warmer-{os.getpid()}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"this machine lets no test make a memory cgroup: {exc}")
    try:
        yield path
    finally:
        for _ in range(100):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_a_warm_move_leaves_the_process_where_it_is(scratch_cgroup: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(scratch_cgroup)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    moves, stayed = done.stdout.split()
    assert int(moves) >= 1, done.stdout
    assert stayed == "True", done.stdout  # each thread still in its cgroup
    # Nothing is left in it once the child ended: it was the only member.
    assert (scratch_cgroup / "cgroup.procs").read_text().split() == []


def test_a_warmer_whose_cgroup_went_away_stops_quietly(tmp_path: Path) -> None:
    warmer = MoveWarmer(tmp_path / "gone")
    warmer.warm()
    warmer.warm()
    began = time.monotonic()
    warmer.close()
    assert time.monotonic() - began < 5  # its thread had ended: nothing to wait for
    assert warmer.moves == 0


def test_the_move_is_of_the_writing_process_to_the_cgroup_it_names(tmp_path: Path) -> None:
    """What it writes, seen in a plain directory standing for the cgroup: "0", the writing
    process itself (the kernel's word for it), and to that cgroup's `cgroup.procs` only."""
    (tmp_path / "cgroup.procs").write_text("")
    warmer = MoveWarmer(tmp_path)
    warmer.warm()
    deadline = time.monotonic() + 10
    while warmer.moves < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    warmer.close()
    assert warmer.moves == 1
    assert (tmp_path / "cgroup.procs").read_text() == "0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cgroup.procs"]
