"""`--ram` and `--cpus` held by the job's own cgroups on this machine's cgroup v1, for
real: a root daemon in a memory cgroup standing in for the unit's `MemoryMax=` (as
tests/security/test_host_memory.py starts it), a job of a real user whose memory cgroup's
limit is its `--ram` and whose cpuset is its `--cpus` (what `os.sched_getaffinity` says
inside the job), two such jobs on disjoint cores, and the cpusets gone at their end."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from gpusched.client import Client
from gpusched.core.errors import UsageError
from gpusched.interactive.reservation import queue, report_end, wait_placed
from gpusched.processes import cgroups, cpusets
from tests.daemon_harness import RunningDaemon, eventually
from tests.security.test_host_memory import capped_daemon  # noqa: F401 (a fixture)
from tests.users import User, as_user

MiB = 2**20

# What the job sees of itself: its cores, and its pid (whose memory cgroup the test
# reads: a job cannot read its cgroup's files under the daemon's root-only directory).
SELF_REPORT = r"""
import json, os, time
print(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}), flush=True)
time.sleep(4)
"""


def _memory_limit(pid: int) -> int:
    """The limit of the memory cgroup `pid` is in (cgroup v1: its own, not an ancestor's)."""
    own = cgroups.own_memory_cgroup(pid)
    assert own is not None and own.version == 1, own
    limit = own.limit()
    assert limit is not None
    return limit


def _submit(daemon: RunningDaemon, user: User, ram: str, cpus: int | None = None) -> int:
    sock = daemon.socket_path
    command = ["python3", "-c", SELF_REPORT]
    job = as_user(
        user,
        lambda: Client(sock).submit(command, mem="1G", cwd=user.home, ram=ram, cpus=cpus).to_json(),
    )
    return int(job["id"])


def _report(daemon: RunningDaemon, job_id: int) -> dict[str, object]:
    def printed() -> str:
        return daemon.log(job_id).strip()

    text = eventually(printed, timeout=30, describe=lambda: f"job {job_id} printed nothing")
    assert text.startswith("{"), text
    return dict(json.loads(text.splitlines()[0]))


def test_ram_is_the_jobs_memory_limit_and_cpus_its_cores(
    people: tuple[User, User],
    capped_daemon: tuple[RunningDaemon, Path],  # noqa: F811
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two jobs on disjoint cores need two cores")
    user, _other = people
    daemon, _cgroup = capped_daemon
    first = _submit(daemon, user, ram="256M", cpus=1)
    second = _submit(daemon, user, ram="200M", cpus=1)
    one, two = _report(daemon, first), _report(daemon, second)
    assert _memory_limit(int(one["pid"])) == 256 * MiB  # type: ignore[call-overload]
    assert _memory_limit(int(two["pid"])) == 200 * MiB  # type: ignore[call-overload]
    assert len(one["cores"]) == len(two["cores"]) == 1  # type: ignore[arg-type]
    assert one["cores"] != two["cores"]  # packed jobs stay off each other's cores
    shown = daemon.show(first)
    assert (shown["ram"], shown["cpus"]) == (256 * MiB, 1)
    for job_id in (first, second):
        ended = daemon.wait_state(job_id, {"done", "failed", "lost"}, timeout=30)
        assert ended["state"] == "done", ended
    root = _cpuset_root(daemon)
    eventually(lambda: not list(root.glob("job-*")), timeout=10)


def test_ram_past_the_services_memory_is_refused_at_submit(
    people: tuple[User, User],
    capped_daemon: tuple[RunningDaemon, Path],  # noqa: F811
) -> None:
    user, _other = people
    daemon, _cgroup = capped_daemon
    with pytest.raises(UsageError, match="--ram 1G is more than this server gives its jobs"):
        _submit(daemon, user, ram="1G")


def _cpuset_root(daemon: RunningDaemon) -> Path:
    """The daemon's v1 cpuset directory (gpusched.processes.cpusets.prepare_root)."""
    found = cpusets.prepare_root(None, daemon.root / "state", 0)
    assert not isinstance(found, str), found
    return found.path


def test_run_puts_its_command_in_the_jobs_cgroups(
    people: tuple[User, User],
    capped_daemon: tuple[RunningDaemon, Path],  # noqa: F811
) -> None:
    """`gpusched run --ram --cpus` (its client's half, gpusched.interactive.reservation,
    in a process of a real user): the command runs in the user's own process tree, and
    still in a memory cgroup capped at --ram and a cpuset of --cpus, gone at its end."""
    user, _other = people
    daemon, cgroup = capped_daemon
    sock = daemon.socket_path
    code = "import os, time; print(sorted(os.sched_getaffinity(0)), flush=True); time.sleep(3)"

    def run() -> list[object]:
        client = Client(sock)
        job = queue(client, ["python3", "-c", code], ram="128M", cpus=1)
        wait_placed(client, job.id, timeout_s=30)
        done = subprocess.run(
            ["python3", "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
        report_end(client, job.id, exit_code=done.returncode)
        return [done.returncode, done.stdout]

    result: list[list[object]] = []
    probe = threading.Thread(target=lambda: result.append(as_user(user, run)))
    probe.start()
    made = eventually(
        lambda: list(cgroup.glob("job-*")), timeout=30, describe=lambda: "no job cgroup"
    )
    limit = cgroups.MemoryCgroup(made[0], 1).limit()
    probe.join(60)
    code_out, printed = result[0]
    assert code_out == 0, result
    assert len(json.loads(str(printed))) == 1, printed  # one core: its --cpus
    assert limit == 128 * MiB
    eventually(lambda: not list(cgroup.glob("job-*")), timeout=10)
    eventually(lambda: not list(_cpuset_root(daemon).glob("job-*")), timeout=10)


# 100 MiB touched, then a second of CPU in a child process (its time counts too).
HUNGRY = r"""
import os, time
block = bytearray(100 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
if os.fork() == 0:
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    os._exit(0)
os.wait()
"""


def test_a_jobs_peak_host_memory_and_cpu_time_are_recorded(
    people: tuple[User, User],
    capped_daemon: tuple[RunningDaemon, Path],  # noqa: F811
) -> None:
    user, _other = people
    daemon, _cgroup = capped_daemon
    sock = daemon.socket_path
    command = ["python3", "-c", HUNGRY]
    job = as_user(user, lambda: Client(sock).submit(command, mem="1G", cwd=user.home).to_json())
    ended = daemon.wait_state(int(job["id"]), {"done", "failed", "lost"}, timeout=60)
    assert ended["state"] == "done", ended
    assert 100 * MiB <= ended["host_peak"] <= 300 * MiB, ended
    assert 0.9 <= ended["cpu_s"] <= 10, ended
