"""Each job's cores (gpusched.processes.cpusets): the cpuset lists, the cores a job is
given (disjoint from other jobs' while there are enough), and cgroup v2's documented
files (`cgroup.subtree_control`, `cpuset.cpus`, beside `memory.max`) written into a
directory standing in for cgroupfs. cgroup v1 is tested for real in
tests/security/test_host_limits.py; a real v2 hierarchy, where this machine has one, by
the marked test at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.processes import cgroups, cpusets


@given(st.sets(st.integers(0, 300)))
def test_a_list_of_cores_reads_back_as_written(cores: set[int]) -> None:
    assert cpusets.parse_cpus(cpusets.format_cpus(cores)) == tuple(sorted(cores))


def test_the_kernels_lists_are_read() -> None:
    assert cpusets.parse_cpus("0-3,6\n") == (0, 1, 2, 3, 6)
    assert cpusets.format_cpus([6, 0, 1, 2, 3]) == "0-3,6"


@given(st.integers(1, 32), st.lists(st.integers(1, 8), max_size=10))
def test_jobs_get_disjoint_cores_while_there_are_enough(cores: int, asks: list[int]) -> None:
    everyone = tuple(range(cores))
    given_out: list[tuple[int, ...]] = []
    for count in asks:
        got = cpusets.pick_cores(everyone, given_out, count)
        assert len(got) == min(count, cores)
        if sum(map(len, given_out)) + count <= cores:
            assert not set(got) & {c for each in given_out for c in each}
        given_out.append(got)


def _stand_in(tmp_path: Path) -> cgroups.MemoryCgroup:
    """A service's v2 cgroup as the kernel lays it out, with the cpuset controller."""
    service = tmp_path / "gpusched.service"
    service.mkdir()
    (service / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (service / "cgroup.subtree_control").write_text("")
    (service / "cpuset.cpus.effective").write_text("0-7\n")
    return cgroups.MemoryCgroup(service, 2)


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon makes cpusets as root only")
def test_cgroup_v2_files_are_the_kernels_documented_ones(tmp_path: Path) -> None:
    service = _stand_in(tmp_path)
    root = cpusets.prepare_root(service, tmp_path / "state", reserve=2)
    assert isinstance(root, cpusets.CpusetRoot), root
    assert (service.path / "cgroup.subtree_control").read_text() == "+cpuset"
    assert (root.path, root.version, root.cores) == (service.path, 2, (2, 3, 4, 5, 6, 7))
    first = cpusets.assign(root, 1, 4)
    second = cpusets.assign(root, 2, 4)
    assert first == {"path": str(service.path / "job-1"), "version": 2, "cpus": "2-5"}
    assert (service.path / "job-1" / "cpuset.cpus").read_text() == "2-5"
    # The two cores no job holds, then the lowest of those one job holds.
    assert second["cpus"] == "2-3,6-7"
    assert (service.path / "job-2" / "cpuset.cpus").read_text() == "2-3,6-7"
    assert not (service.path / "job-1" / "cpuset.mems").exists()  # v2 needs none
    cgroups.MemoryCgroup(service.path / "job-1", 2).set_limit(3 * 2**30)
    assert (service.path / "job-1" / "memory.max").read_text() == str(3 * 2**30)


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon makes cpusets as root only")
def test_a_v2_service_without_the_cpuset_controller_says_so(tmp_path: Path) -> None:
    service = _stand_in(tmp_path)
    (service.path / "cgroup.controllers").write_text("memory pids\n")
    assert cpusets.prepare_root(service, tmp_path, 0) == (
        "no cpuset controller in the service's cgroup (cgroup v2)"
    )


def test_an_empty_cpuset_left_long_ago_no_longer_counts(tmp_path: Path) -> None:
    root = cpusets.CpusetRoot(tmp_path, 1, (0, 1), "0")
    for job_id, cpus in ((1, "0"), (2, "1")):
        cpusets.make_job_cpuset(root.job(job_id), 1, cpus, "0")
        (root.job(job_id) / "cgroup.procs").write_text("")
    (root.job(1) / "cgroup.procs").write_text("4242\n")  # a job's process: in use
    old = 1_000_000_000.0
    for job_id in (1, 2):
        os.utime(root.job(job_id), (old, old))
    assert root.in_use() == [(0,)]
    # (a real cgroup's directory goes with rmdir; a stand-in's files keep this one)
    (root.job(3)).mkdir()
    (root.job(3) / "cgroup.procs").write_text("")
    (root.job(3) / "cpuset.cpus").write_text("1")
    assert sorted(root.in_use()) == [(0,), (1,)]  # just made: its job is starting


def _real_v2() -> cgroups.MemoryCgroup | None:
    own = cgroups.own_memory_cgroup()
    return own if own is not None and own.version == 2 else None


@pytest.mark.skipif(_real_v2() is None, reason="this machine has no cgroup v2 memory hierarchy")
def test_on_real_cgroup_v2_a_job_cpuset_takes_its_cores(tmp_path: Path) -> None:
    own = _real_v2()
    assert own is not None
    parent = own.path / f"gpusched-test-{os.getpid()}"
    parent.mkdir()
    try:
        service = cgroups.MemoryCgroup(parent, 2)
        root = cpusets.prepare_root(service, tmp_path, 0)
        if isinstance(root, str):
            pytest.skip(root)
        cpusets.assign(root, 1, 1)
        assert len(cpusets.parse_cpus((root.job(1) / "cpuset.cpus").read_text())) == 1
    finally:
        for child in parent.glob("job-*"):
            child.rmdir()
        parent.rmdir()
