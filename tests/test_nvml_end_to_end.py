"""End to end on the fake NVML driver: the real daemon reads GPUs through nvidia-ml-py.

The fake driver's GPUs come from a state file that these tests rewrite while the daemon
runs; test jobs (tests/fakenvml/gpujob.py) "allocate" by registering their pid in it.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml
from tests.fakenvml.state import FakeGpu, fake_uuid

GiB = 2**30
RESERVED = 256 * 2**20  # the fake driver's default driver-reserved memory
HEADROOM = 512 * 2**20


@pytest.fixture
def fake(fake_nvml: FakeNvml) -> FakeNvml:
    """Two idle 24 GiB GPUs on the fake driver (tests rewrite them as they go)."""
    return fake_nvml


def start(daemon_factory: Any, fake: FakeNvml, **config: Any) -> RunningDaemon:
    settings = {"poll_interval": "0.5s", **config}
    daemon = daemon_factory(simulate=None, config=settings, env=fake.env()).start()
    eventually(lambda: daemon.status()["gpus"])  # it answers before its first reading of them
    return daemon


def gpus_by_index(daemon: RunningDaemon) -> dict[int, dict[str, Any]]:
    return {g["index"]: g for g in daemon.status()["gpus"]}


def test_job_avoids_memory_held_by_other_processes(daemon_factory: Any, fake: FakeNvml) -> None:
    fake.set_gpus(
        [
            FakeGpu(uuid=fake_uuid(0), other_bytes=12 * GiB),
            FakeGpu(uuid=fake_uuid(1), other_bytes=4 * GiB),
        ]
    )
    daemon = start(daemon_factory, fake)
    gpus = gpus_by_index(daemon)
    assert gpus[0]["available"] == 24 * GiB - 12 * GiB - RESERVED - HEADROOM
    assert gpus[1]["used_by_others"] == 4 * GiB
    job = daemon.submit("--mem", "8G", "--", *fake.gpujob_argv("--mem", "8G", "--hold", "30"))
    assert daemon.wait_state(job, {"running"})["gpu_indices"] == [1]
    # A card filled from outside gets no job at all.
    fake.set_gpu(1, other_bytes=23 * GiB)
    fake.set_gpu(0, other_bytes=23 * GiB)
    # Both cards read full before the job is submitted (else it could start at once).
    eventually(lambda: all(g["available"] < 2 * GiB for g in gpus_by_index(daemon).values()))
    blocked = daemon.submit("--mem", "2G", "--", "true")
    daemon.wait_reason(blocked, "needs 2.0G")
    fake.set_gpu(0, other_bytes=0)
    assert daemon.wait_state(blocked, {"done"})["gpu_indices"] == [0]


def test_allocation_lag_never_overcommits_a_card(daemon_factory: Any, fake: FakeNvml) -> None:
    # GPU 1 is nearly full from outside, so only GPU 0 can take a 16G job, and only one.
    fake.set_gpus([FakeGpu(uuid=fake_uuid(0)), FakeGpu(uuid=fake_uuid(1), other_bytes=20 * GiB)])
    daemon = start(daemon_factory, fake)
    job_argv = fake.gpujob_argv("--lag", "2", "--mem", "16G", "--hold", "1")
    first = daemon.submit("--mem", "16G", "--", *job_argv)
    time.sleep(0.1)
    second = daemon.submit("--mem", "16G", "--", *job_argv)
    overlap = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            states = {j.id: j.state for j in daemon.client().status().jobs}
            if states.get(first) == "running" and states.get(second) == "running":
                overlap.append(states)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        jobs = daemon.client().wait([first, second], timeout=30)
    finally:
        stop.set()
        watcher.join()
    assert [j.state for j in jobs] == ["done", "done"], [j.to_json() for j in jobs]
    assert overlap == []
    assert jobs[0].gpu_indices == jobs[1].gpu_indices == [0]
    assert jobs[1].started_at is not None and jobs[0].ended_at is not None
    assert jobs[1].started_at >= jobs[0].ended_at
    assert jobs[0].peak_mem == 16 * GiB


def test_status_splits_memory_between_jobs_others_and_reservations(
    daemon_factory: Any, fake: FakeNvml
) -> None:
    fake.set_gpus([FakeGpu(uuid=fake_uuid(0), other_bytes=3 * GiB)])
    daemon = start(daemon_factory, fake)
    job = daemon.submit(
        "--mem",
        "10G",
        "--",
        *fake.gpujob_argv(
            "--lag",
            "1",
            "--mem",
            "4G",
            "--hold",
            "30",
            "--grow",
            "14G",
            "--grow-after",
            "2",
            "--child",
        ),
    )
    daemon.wait_state(job, {"running"})
    # Before it allocates: the whole claim is reserved.
    gpu = gpus_by_index(daemon)[0]
    assert gpu["reserved"] + gpu["used_by_jobs"] == 10 * GiB
    # After it allocates 4G (from a child process): 4G used by the job, 6G still reserved.
    gpu = eventually(lambda: (g := gpus_by_index(daemon)[0])["used_by_jobs"] == 4 * GiB and g)
    assert gpu["used_by_others"] == 3 * GiB
    assert gpu["reserved"] == 6 * GiB
    assert gpu["available"] == 24 * GiB - RESERVED - 3 * GiB - 4 * GiB - 6 * GiB - HEADROOM
    assert gpu["jobs"] == [job]
    # It grows past its claim: nothing reserved, everything it uses counts.
    gpu = eventually(lambda: (g := gpus_by_index(daemon)[0])["used_by_jobs"] == 14 * GiB and g)
    assert gpu["reserved"] == 0
    assert gpu["available"] == 24 * GiB - RESERVED - 3 * GiB - 14 * GiB - HEADROOM
    eventually(lambda: daemon.show(job)["peak_mem"] == 14 * GiB)
    human = daemon.cli("status")
    assert "Fake GPU" in human.stdout  # status drops the "NVIDIA " every card has


def test_lost_gpu_gets_no_job_and_comes_back(daemon_factory: Any, fake: FakeNvml) -> None:
    daemon = start(daemon_factory, fake)
    fake.set_gpu(0, lost=True)
    gpu = eventually(lambda: (g := gpus_by_index(daemon)[0])["state"] == "lost" and g)
    assert gpu["available"] == 0
    assert gpu["error"]
    jobs = [daemon.submit("--mem", "2G", "--", "sleep", "30") for _ in range(3)]
    for job in jobs:
        assert daemon.wait_state(job, {"running"})["gpu_indices"] == [1]
    whole = daemon.submit("--", "true")
    daemon.wait_reason(whole, "GPU")  # a pass has seen it and left it waiting
    fake.set_gpu(0, lost=False)
    assert daemon.wait_state(whole, {"done"})["gpu_indices"] == [0]
    assert gpus_by_index(daemon)[0]["state"] == "ok"
    assert daemon.process is not None and daemon.process.poll() is None


def _assert_daemon_refuses_with_one_line(daemon: RunningDaemon) -> None:
    """`gpusched daemon` exits 1 with one error line that suggests --simulate, no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpusched:")]
    assert len(errors) == 1, result.stderr
    assert "--simulate" in errors[0]
    assert "Traceback" not in result.stderr


def test_no_driver_exits_with_one_line_suggesting_simulate(
    daemon_factory: Any, fake: FakeNvml
) -> None:
    fake.set_driver(loaded=False)
    _assert_daemon_refuses_with_one_line(daemon_factory(simulate=None, env=fake.env()))


def test_no_library_at_all_exits_with_one_line(daemon_factory: Any, tmp_path: Any) -> None:
    env = {"LD_LIBRARY_PATH": str(tmp_path)}
    _assert_daemon_refuses_with_one_line(daemon_factory(simulate=None, env=env))


def test_visible_devices_uuid_and_gpu_selection(daemon_factory: Any, fake: FakeNvml) -> None:
    fake.set_gpus([24 * GiB, 24 * GiB, 24 * GiB])
    daemon = start(daemon_factory, fake, visible_devices="uuid", gpus=[1, fake_uuid(2)])
    states = {i: g["state"] for i, g in gpus_by_index(daemon).items()}
    assert states == {0: "excluded", 1: "ok", 2: "ok"}
    job = daemon.submit(
        "--mem",
        "1G",
        "--gpus",
        "2",
        "--",
        sys.executable,
        "-c",
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    done = daemon.wait_state(job, {"done"})
    assert sorted(done["gpu_indices"]) == [1, 2]
    assert daemon.log(job).strip().split(",") == done["gpu_uuids"]
    assert set(done["gpu_uuids"]) == {fake_uuid(1), fake_uuid(2)}


def test_multi_gpu_job_gets_distinct_cards_each_with_room(
    daemon_factory: Any, fake: FakeNvml
) -> None:
    fake.set_gpus(
        [
            FakeGpu(uuid=fake_uuid(0), other_bytes=20 * GiB),
            FakeGpu(uuid=fake_uuid(1)),
            FakeGpu(uuid=fake_uuid(2), other_bytes=2 * GiB),
        ]
    )
    daemon = start(daemon_factory, fake)
    job = daemon.submit(
        "--mem", "10G", "--gpus", "2", "--", *fake.gpujob_argv("--mem", "10G", "--hold", "30")
    )
    running = daemon.wait_state(job, {"running"})
    assert sorted(running["gpu_indices"]) == [1, 2]
    gpus = eventually(lambda: (g := gpus_by_index(daemon))[1]["used_by_jobs"] == 10 * GiB and g)
    assert gpus[2]["used_by_jobs"] == 10 * GiB
    assert gpus[0]["jobs"] == []


def test_status_names_the_owner_of_memory_outside_gpusched_and_each_jobs_use(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    """gpustat on the same driver shows `user:python3/PID(10240M)`: so does status, and
    each GPU reports what every gpusched job on it holds."""

    fake_nvml.set_gpus([24 * GiB])
    daemon = daemon_factory(simulate=None, config={"poll_interval": "0.3s"}, env=fake_nvml.env())
    daemon.start()
    outsider = subprocess.Popen(["sleep", "120"])
    try:
        fake_nvml.register_process(0, outsider.pid, 10 * GiB)
        job_id = daemon.submit(
            "--mem", "4G", "--", *fake_nvml.gpujob_argv("--mem", "3G", "--hold", "60")
        )  # fmt: skip

        def reported() -> dict[str, Any] | None:
            gpu = daemon.status()["gpus"][0]
            return gpu if gpu["others"] and gpu["job_mem"].get(str(job_id)) else None

        gpu = eventually(reported, timeout=30)
        assert gpu is not None
        assert gpu["job_mem"][str(job_id)] == 3 * GiB
        [other] = gpu["others"]
        assert (other["pid"], other["command"], other["used"]) == (outsider.pid, "sleep", 10 * GiB)
        assert other["user"] == "root"
        text = daemon.cli("status").stdout
        assert f"others: root:sleep/{outsider.pid}(10G)" in text
    finally:
        outsider.kill()
        outsider.wait()
        daemon.stop()
        daemon.kill_jobs()


def _read_once_more(daemon: RunningDaemon, fake: FakeNvml, mark: int) -> dict[str, Any]:
    """GPU 0 as one more pass read it, with no pass after it to come: the card's
    utilization set to `mark`, one submit wakes a pass (nothing else does: poll_interval
    is 1h), and status shows `mark` once that pass has published (one pass at a time)."""
    fake.set_gpu(0, util_percent=mark)
    daemon.submit("--hold", "--", "true")
    gpu = eventually(
        lambda: next((g for g in daemon.status()["gpus"] if g["util"] == mark), None), 30
    )
    assert isinstance(gpu, dict)
    return gpu


def _readings_until(
    daemon: RunningDaemon, fake: FakeNvml, done: Callable[[dict[str, Any]], bool]
) -> None:
    for mark in range(1, 60):
        if done(_read_once_more(daemon, fake, mark)):
            return
    raise AssertionError(f"never: {daemon.status()['gpus']}")


def test_a_jobs_process_that_exits_between_readings_stays_the_jobs(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    """A job's GPU process that has exited since the last reading (as in a job's SIGTERM
    grace, the rest of its tree still ending) is the job's in `status` until the next
    reading: its memory the job's, never an unknown other's (`?:?/PID(2G)`)."""
    fake_nvml.set_gpus([24 * GiB])
    config = {"poll_interval": "1h"}  # a pass reads the GPUs only when woken: by a submit
    daemon = daemon_factory(simulate=None, config=config, env=fake_nvml.env()).start()
    try:
        holder = shlex.join(fake_nvml.gpujob_argv("--mem", "2G", "--hold", "600"))
        job_id = daemon.submit("--mem", "4G", "--", "sh", "-c", f"{holder}; sleep 600")
        said = eventually(lambda: re.search(r"gpujob\[(\d+)\]: allocated", daemon.log(job_id)))
        assert said is not None
        pid = int(said.group(1))
        _readings_until(daemon, fake_nvml, lambda g: g["job_mem"] == {str(job_id): 2 * GiB})
        os.kill(pid, signal.SIGKILL)  # sh reaps it and sleeps on: the job runs on
        eventually(lambda: not Path(f"/proc/{pid}").exists(), 10)
        gpu = daemon.status()["gpus"][0]
        assert gpu["job_mem"] == {str(job_id): 2 * GiB}
        assert gpu["others"] == [], gpu["others"]
        shown = daemon.cli("status").stdout
        assert "others:" not in shown and "?:?" not in shown, shown
    finally:
        daemon.stop()
        daemon.kill_jobs()


def test_an_outside_process_that_exits_between_readings_is_not_shown_as_unknown(
    daemon_factory: Any, fake_nvml: FakeNvml
) -> None:
    """A process gpusched did not start, named under its GPU, that exits before the next
    reading: it holds nothing any more, and is left out of `others` rather than shown as
    `?:?/PID` (which stays for what /proc never showed: another pid namespace's)."""
    fake_nvml.set_gpus([24 * GiB])
    config = {"poll_interval": "1h"}
    daemon = daemon_factory(simulate=None, config=config, env=fake_nvml.env()).start()
    outsider = subprocess.Popen(["sleep", "120"])
    try:
        fake_nvml.register_process(0, outsider.pid, 3 * GiB)
        named = [(outsider.pid, "root")]
        _readings_until(
            daemon, fake_nvml, lambda g: [(o["pid"], o["user"]) for o in g["others"]] == named
        )
    finally:
        outsider.kill()
        outsider.wait()
    try:
        gpu = daemon.status()["gpus"][0]
        assert gpu["others"] == [], gpu["others"]
        assert "?:?" not in daemon.cli("status").stdout
    finally:
        daemon.stop()
        daemon.kill_jobs()


def test_a_process_proc_never_showed_is_still_an_unknown_other(tmp_path: Path) -> None:
    """A pid with no /proc entry here from the first: another pid namespace's, whose
    memory is real; it is shown, as "?", unless the reading saw it (then it has exited)."""
    from gpusched.core.models import GpuProcess
    from gpusched.gpus.process_owners import outside_processes

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no /proc entry, as for a pid of another namespace
    held = [GpuProcess(gone.pid, 2 * GiB)]
    unknown = {"pid": gone.pid, "user": None, "command": None, "used": 2 * GiB}
    assert outside_processes(held, job_pids=[]) == [unknown]
    assert outside_processes(held, job_pids=[], seen=[gone.pid]) == []
