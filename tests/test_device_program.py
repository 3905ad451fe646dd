"""The cgroup v2 device program, enforced by the kernel: a denied node cannot be opened.

This machine's cgroup v1 hierarchies sit beside a cgroup v2 one (hybrid, mounted at
/sys/fs/cgroup/unified). The kernel's device check asks both v1's devices controller and
the BPF device programs of the process's v2 cgroup, so a program attached to a scratch
directory of the v2 hierarchy is enforced for a process moved there. No NVIDIA driver
exists here: a node the program lets through fails with ENXIO (nothing behind it), a
denied one with EPERM before the driver is looked for.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.processes import device_program
from tests.test_supervisor import Run

NVIDIA_MAJOR = 195


def _v2_root() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted (hybrid or unified), if any."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "attaching a device program and moving a process take root"
    if _v2_root() is None:
        return "no cgroup v2 hierarchy is mounted here"
    return device_program.unavailable()


# In the cgroup named first (`-`: where it was started), open each node named after it;
# prints {name: errno name or "opened"}.
OPEN_IN = r"""
import errno, json, os, sys
if sys.argv[1] != "-":
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
seen = {}
for path in sys.argv[2:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        seen[os.path.basename(path)] = "opened"
    except OSError as exc:
        seen[os.path.basename(path)] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""


@pytest.fixture
def scratch_cgroup() -> Iterator[Path]:
    why = _skip_reason()
    if why is not None:
        pytest.skip(why)
    root = _v2_root()
    assert root is not None
    path = root / f"gpusched-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        for child in [p for p in path.iterdir() if p.is_dir()]:  # a job's, if left behind
            with contextlib.suppress(OSError):
                child.rmdir()
        path.rmdir()  # its processes have exited: empty


def _node(directory: Path, name: str, minor: int) -> str:
    path = directory / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    return str(path)


def _open_in(cgroup: Path | None, nodes: list[str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", OPEN_IN, str(cgroup or "-"), *nodes],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(done.stdout))


def test_a_denied_card_node_is_eperm_and_the_others_reach_the_driver(
    scratch_cgroup: Path, tmp_path: Path
) -> None:
    nodes = [_node(tmp_path, "card0", 0), _node(tmp_path, "card1", 1), "/dev/null"]
    # The program is not in force before it is attached: the same nodes, no EPERM.
    assert _open_in(scratch_cgroup, nodes) == {"card0": "ENXIO", "card1": "ENXIO", "null": "opened"}
    device_program.fence(scratch_cgroup, [(NVIDIA_MAJOR, 1)])
    assert _open_in(scratch_cgroup, nodes) == {"card0": "ENXIO", "card1": "EPERM", "null": "opened"}
    # Only the cgroup's processes are fenced.
    assert _open_in(None, nodes)["card1"] == "ENXIO"


def test_it_denies_each_listed_node_and_only_character_devices(
    scratch_cgroup: Path, tmp_path: Path
) -> None:
    block = tmp_path / "block195-3"
    os.mknod(block, 0o666 | stat.S_IFBLK, os.makedev(NVIDIA_MAJOR, 3))
    nodes = [_node(tmp_path, f"card{m}", m) for m in (2, 3, 4, 255)] + [str(block)]
    device_program.fence(scratch_cgroup, [(NVIDIA_MAJOR, 2), (NVIDIA_MAJOR, 3), (508, 4)])
    seen = _open_in(scratch_cgroup, nodes)
    assert seen["card2"] == seen["card3"] == "EPERM"
    # Another major's minor 4 is not 195:4; the control node 195:255 stays open.
    assert seen["card4"] == seen["card255"] == "ENXIO"
    # A block device with the same numbers is another device (no driver: ENXIO).
    assert seen["block195-3"] == "ENXIO"


def test_a_second_program_adds_to_the_first(scratch_cgroup: Path, tmp_path: Path) -> None:
    nodes = [_node(tmp_path, f"card{m}", m) for m in (6, 7)]
    device_program.fence(scratch_cgroup, [(NVIDIA_MAJOR, 6)])
    device_program.fence(scratch_cgroup, [(NVIDIA_MAJOR, 7)])  # BPF_F_ALLOW_MULTI: both hold
    assert _open_in(scratch_cgroup, nodes) == {"card6": "EPERM", "card7": "EPERM"}


def test_the_rules_it_is_given_are_the_v1_deny_lines() -> None:
    assert device_program.parse_rules(["c 195:1 rwm", "c 508:22 rwm"]) == [(195, 1), (508, 22)]
    for bad in ("b 8:0 rwm", "a", "c 195:* rwm", "c 195:1 rwm; reboot"):
        with pytest.raises(ValueError):
            device_program.parse_rules([bad])


def test_the_program_is_one_block_of_four_instructions_per_denied_node() -> None:
    assert len(device_program.assemble([])) == 7 * 8
    assert len(device_program.assemble([(195, 1), (195, 2)])) == (7 + 2 * 4) * 8
    with pytest.raises(ValueError):
        device_program.assemble([(195, m) for m in range(9000)])


def test_attaching_to_what_is_not_a_cgroup_is_an_error(tmp_path: Path) -> None:
    if _skip_reason() is not None:
        pytest.skip(str(_skip_reason()))
    with pytest.raises(device_program.ProgramError) as caught:
        device_program.fence(tmp_path, [(NVIDIA_MAJOR, 1)])
    assert caught.value.errno in (errno.EBADF, errno.EINVAL, errno.ENOTDIR)
    assert str(tmp_path) in str(caught.value)


def _supervise(tmp_path: Path, nodes: list[str], **spec: Any) -> tuple[dict[str, Any], str]:
    """A job opening `nodes` under a real supervisor with `spec`: its end and its log."""
    run = Run(tmp_path, [sys.executable, "-c", OPEN_IN, "-", *nodes], **spec)
    try:
        return run.outcome(), run.log_path.read_text()
    finally:
        run.cleanup()


def test_a_supervised_job_on_cgroup_v2_is_fenced_in_its_own_cgroup(
    scratch_cgroup: Path, tmp_path: Path
) -> None:
    """As the daemon hands it on cgroup v2: the job's memory cgroup and its devices cgroup
    are one directory, fenced before the fork and removed after the job."""
    job = scratch_cgroup / "job-1"
    nodes = [_node(tmp_path, "card0", 0), _node(tmp_path, "card1", 1)]
    outcome, log = _supervise(
        tmp_path,
        nodes,
        cgroup={"path": str(job), "version": 2, "limit": None},
        devices={"path": str(job), "version": 2, "deny": ["c 195:1 rwm"]},
    )
    assert (outcome["outcome"], outcome["exit_code"]) == ("exit", 0), log
    assert json.loads(log.strip().splitlines()[-1]) == {"card0": "ENXIO", "card1": "EPERM"}
    assert not job.exists()


def test_a_job_whose_program_cannot_be_attached_is_not_started(
    scratch_cgroup: Path, tmp_path: Path
) -> None:
    """Not a cgroup (a plain directory): the program has nothing to attach to, and the job
    would run with every card open, so its command never runs."""
    ran = tmp_path / "ran"
    fence = {"path": str(tmp_path / "job-1"), "version": 2, "deny": ["c 195:1 rwm"]}
    run = Run(tmp_path, ["touch", str(ran)], devices=fence)
    try:
        outcome = run.outcome()
    finally:
        run.cleanup()
    assert outcome["outcome"] == "failed_to_start"
    assert outcome["transient"] is False
    assert outcome["message"].startswith("cannot fence off the GPUs it was not given: ")
    assert "BPF device program" in outcome["message"]
    assert not ran.exists()
