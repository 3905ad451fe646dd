"""A job opens only its own cards: the other GPUs' device nodes are denied to it.

`CUDA_VISIBLE_DEVICES` is only an environment variable; mallory's job ignores it and opens
the device nodes of every card itself. The nodes are made here with `mknod` (char 195:M,
M the card's minor number as the fake NVML driver reports it, deliberately not its index)
in a directory she can read: the devices cgroup checks a node at its open wherever it lies.
No NVIDIA driver exists here, so a node the cgroup lets through fails with ENXIO (nothing
behind it) and a fenced one with EPERM, before the driver is looked for.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from gpusched.client import Client
from gpusched.processes import device_program
from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml import state as fakestate
from tests.fakenvml.fixtures import FakeNvml
from tests.users import User, as_user

# Not the indices: a fence that denied /dev/nvidiaINDEX would miss the other card.
MINORS = (5, 2)
NVIDIA_MAJOR = 195
CONTROL_MINOR = 255  # /dev/nvidiactl, which every CUDA program needs

# Opens each node named on its command line, printing {name: errno name or "opened"} and
# the CUDA_VISIBLE_DEVICES it was given.
OPEN_ALL = r"""
import errno, json, os, sys
seen = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        seen[os.path.basename(path)] = "opened"
    except OSError as exc:
        seen[os.path.basename(path)] = errno.errorcode[exc.errno]
print(json.dumps(seen))
"""

V1 = Path("/sys/fs/cgroup/devices").is_dir()
on_v1 = pytest.mark.skipif(not V1, reason="cgroup v1's devices hierarchy fences cards here")


def _node(directory: Path, name: str, minor: int) -> str:
    path = directory / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    path.chmod(0o666)
    return str(path)


def _card_nodes(daemon: RunningDaemon) -> dict[int, str]:
    """A node per card (char 195:minor) in a directory every user can read."""
    nodes = daemon.root / "nodes"
    nodes.mkdir(mode=0o755)
    return {m: _node(nodes, f"nvidia-minor{m}", m) for m in MINORS}


def _fenced_daemon(root_daemon: Callable[..., RunningDaemon], fake: FakeNvml) -> RunningDaemon:
    gpus = fakestate.make_gpus([24 * fakestate.GiB] * 2)
    for gpu, minor in zip(gpus, MINORS, strict=True):
        gpu.minor = minor
    fake.set_gpus(gpus)
    daemon = root_daemon(simulate=None, env=fake.env())
    eventually(lambda: len(daemon.status()["gpus"]) == 2, 30)
    return daemon


def _open_as(daemon: RunningDaemon, user: User, nodes: list[str], gpus: int = 1) -> dict:
    socket_path = daemon.socket_path
    command = ["python3", "-c", OPEN_ALL, *nodes]
    job_id = int(as_user(user, lambda: Client(socket_path).submit(command, gpus=gpus).id))
    done = daemon.wait_state(job_id, {"done", "failed"}, timeout=60)
    assert done["state"] == "done", (done, daemon.log(job_id))
    return {"job": done, "opened": json.loads(daemon.log(job_id).strip().splitlines()[-1])}


@on_v1
def test_a_job_gets_eperm_on_the_other_cards_node_and_not_on_its_own(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    mallory, _victim = people
    daemon = _fenced_daemon(root_daemon, fake_nvml)
    paths = list(_card_nodes(daemon).values())
    paths.append(_node(daemon.root / "nodes", "nvidiactl", CONTROL_MINOR))
    ran = _open_as(daemon, mallory, paths)
    [given] = ran["job"]["gpu_indices"]
    own, other = MINORS[given], MINORS[1 - given]
    opened = ran["opened"]
    assert opened[f"nvidia-minor{other}"] == "EPERM", opened
    # No driver behind the nodes: let through, the open finds nothing there (ENXIO).
    assert opened[f"nvidia-minor{own}"] != "EPERM", opened
    assert opened["nvidiactl"] != "EPERM", opened
    # CUDA may number only the cards the job can open: the UUID names its card either way.
    assert opened["CUDA_VISIBLE_DEVICES"] == ran["job"]["gpu_uuids"][0]
    # The job's devices cgroup went with its end.
    service = next(c for c in daemon.limits.cgroups if (c / "devices.deny").exists())  # type: ignore[attr-defined]
    eventually(lambda: not (service / f"job-{ran['job']['id']}").exists(), 10)


@on_v1
def test_a_job_given_every_card_is_denied_none(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    mallory, _victim = people
    daemon = _fenced_daemon(root_daemon, fake_nvml)
    paths = list(_card_nodes(daemon).values())
    opened = _open_as(daemon, mallory, paths, gpus=2)["opened"]
    assert "EPERM" not in opened.values(), opened
    assert opened["CUDA_VISIBLE_DEVICES"] == "0,1"  # unfenced: NVML's indices, as before


@pytest.mark.skipif(
    V1,
    reason="cgroup v1 here: cards are fenced by the devices hierarchy (tests above); on v2"
    " this checks the daemon says whether a BPF device program fences them",
)
def test_on_cgroup_v2_the_daemon_says_whether_cards_are_fenced(
    root_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = root_daemon()
    if device_program.unavailable() is not None:
        assert "cgroup v2: a job's GPUs are not fenced (cannot load" in daemon.stderr()
    else:  # fenced, or said why not: the daemon's cgroup v2 is not its own
        said = ("BPF device programs on", "the daemon's cgroup v2 is not its alone")
        assert any(s in daemon.stderr() for s in said), daemon.stderr()


@on_v1
def test_a_restarted_daemon_fences_the_next_job_too(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    """A restart finds the supervisors of running jobs in SERVICE/daemon, not beside it in
    SERVICE, so its devices cgroup is still its own and the next job is fenced."""
    mallory, _victim = people
    daemon = _fenced_daemon(root_daemon, fake_nvml)
    socket_path = daemon.socket_path
    running = int(as_user(mallory, lambda: Client(socket_path).submit(["sleep", "60"], gpus=1).id))
    daemon.wait_state(running, {"running"})
    daemon.stop()
    daemon.start()
    nodes = daemon.root / "nodes"
    nodes.mkdir(mode=0o755)
    paths = [_node(nodes, f"nvidia-minor{m}", m) for m in MINORS]
    ran = _open_as(daemon, mallory, paths)
    [given] = ran["job"]["gpu_indices"]
    assert ran["opened"][f"nvidia-minor{MINORS[1 - given]}"] == "EPERM", ran["opened"]
    assert ran["opened"][f"nvidia-minor{MINORS[given]}"] != "EPERM", ran["opened"]


@on_v1
def test_an_interactive_claim_is_fenced_like_a_batch_job(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    fake_nvml: FakeNvml,
) -> None:
    """`claim()` (and `gpusched run`, a kernel): the client process is the job, and what it
    opens after its placement is held to the job's cards as a batch job's command is."""
    mallory, _victim = people
    daemon = _fenced_daemon(root_daemon, fake_nvml)
    paths = _card_nodes(daemon)
    socket_path = str(daemon.socket_path)

    def claim_and_open() -> dict[str, object]:
        """What claim() does, by its own steps: this forked child of a worker that may
        have loaded the fake NVML library would be refused by claim()'s CUDA check."""
        import errno

        from gpusched.interactive.claim import Claim
        from gpusched.interactive.reservation import queue, wait_placed

        client = Client(socket_path)
        job = queue(client, ["python3", "claim.py"], mem="1G", gpus=1)
        held = Claim(client, wait_placed(client, job.id, timeout_s=30))
        seen: dict[str, object] = {"indices": held.gpu_indices, "env": dict(os.environ)}
        for minor, path in paths.items():
            try:
                os.close(os.open(path, os.O_RDWR))
                seen[str(minor)] = "opened"
            except OSError as exc:
                seen[str(minor)] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        held.release()
        seen["job"] = held.job_id
        return seen

    seen = as_user(mallory, claim_and_open)
    indices = seen["indices"]
    assert isinstance(indices, list) and len(indices) == 1, seen
    given = int(indices[0])
    own, other = MINORS[given], MINORS[1 - given]
    assert seen[str(other)] == "EPERM", seen
    assert seen[str(own)] != "EPERM", seen
    env = seen["env"]
    assert isinstance(env, dict) and env["CUDA_VISIBLE_DEVICES"].startswith("GPU-"), env
    # Its devices cgroup goes once its client has gone.
    service = next(c for c in daemon.limits.cgroups if (c / "devices.deny").exists())  # type: ignore[attr-defined]
    eventually(lambda: not (service / f"job-{seen['job']}").exists(), 30)
