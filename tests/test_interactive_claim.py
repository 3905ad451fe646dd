"""`gpusched.claim()` end to end: a Python process (as a notebook's kernel would) claims a
GPU from a real daemon, then allocates on it through the fake NVML driver; the daemon
measures that memory as the job's, and the job ends when the process releases or exits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_harness import RunningDaemon, eventually
from tests.fakenvml.fixtures import FakeNvml


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon (conftest.py `shared_daemon`): each claim test holds and releases
    only its own jobs (those on the fake NVML driver start their own daemon)."""
    return shared_daemon


GiB = 2**30


def python(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(process: subprocess.Popen[str], prefix: str) -> list[str]:
    """The words of the first line the process prints that starts with `prefix`."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.split()
    errors = process.stderr.read() if process.stderr else ""
    raise AssertionError(f"no {prefix!r} line; stderr: {errors}")


NOTEBOOK = """
    import os, sys, time
    import gpusched                        # the first cell, before any framework
    gpu = gpusched.claim(mem="6G")
    print("claimed", gpu.job_id, os.environ["CUDA_VISIBLE_DEVICES"],
          os.environ["CUDA_DEVICE_ORDER"], os.environ["GPUSCHED_JOB_ID"], flush=True)
    from tests.fakenvml import state       # "import torch; torch.zeros(...)": 5G on the card
    state.register_process(os.environ["FAKENVML_STATE"], gpu.gpu_uuids[0], os.getpid(), 5 << 30)
    print("allocated", flush=True)
    while not os.path.exists({go!r}):
        time.sleep(0.05)
    {end}
    print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("end", "state"),
    [("gpu.release()", "done"), ("pass  # exits holding it: released at exit", "done")],
)
def test_a_claiming_process_is_the_job_and_its_memory_is_measured(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path, end: str, state: str
) -> None:
    daemon = daemon_factory(simulate=None, config={"poll_interval": "0.5s"}, env=fake_nvml.env())
    daemon.start()
    go = tmp_path / "go"
    notebook = python(NOTEBOOK.format(go=str(go), end=end), daemon.env)
    try:
        words = read_line(notebook, "claimed")
        job, visible = int(words[1]), words[2]
        assert words[3:] == ["PCI_BUS_ID", str(job)]
        running = daemon.show(job)
        assert (running["state"], running["pid"], running["interactive"]) == (
            "running",
            notebook.pid,
            True,
        )
        assert running["gpu_indices"] == [int(visible)]
        read_line(notebook, "allocated")
        measured = eventually(lambda: daemon.show(job)["peak_mem"] == 5 * GiB, timeout=15)
        assert measured
        gpu = next(g for g in daemon.status()["gpus"] if g["index"] == int(visible))
        assert gpu["used_by_jobs"] == 5 * GiB and gpu["used_by_others"] == 0
        go.touch()
        read_line(notebook, "done")
        assert notebook.wait(timeout=30) == 0
        ended = daemon.wait_state(job, {"done", "failed", "lost"})
        assert (ended["state"], ended["exit_code"]) == (state, 0)
        assert ended["peak_mem"] == 5 * GiB  # in history too
        shown = json.loads(daemon.cli("show", "--json", str(job)).stdout)
        assert max(point["memory"] or 0 for point in shown["timeline"]) == 5 * GiB
    finally:
        notebook.kill()
        notebook.communicate()  # reaps it and closes its pipes


def test_claim_as_a_context_manager_and_with_a_timeout(daemon: RunningDaemon) -> None:
    code = """
        import os, gpusched
        with gpusched.claim(mem="20G") as held:
            print("held", held.job_id, os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
            others = [gpusched.claim(mem="20G")]  # the second card
            try:
                gpusched.claim(mem="20G", timeout=1.5)  # no third card
            except gpusched.NotPlaced as exc:
                print("not placed:", exc.message, flush=True)
            others[0].release()
        print("after", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**daemon.env, "CUDA_VISIBLE_DEVICES": "before"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    held = int(lines[0].split()[1])
    assert lines[1].startswith("not placed: job ") and "was not placed within 1.5s" in lines[1]
    withdrawn = int(lines[1].split()[3])
    assert lines[2] == "after before"  # the variables are put back at release
    assert daemon.show(held)["state"] == "done"
    assert daemon.show(withdrawn)["state"] == "cancelled"  # never left waiting


def test_a_waiting_claim_says_why_and_its_withdrawal_says_so(daemon: RunningDaemon) -> None:
    """Issue 28: claim(timeout=...) printed nothing while it waited, NotPlaced lacked the
    reason, and the withdrawn job read "cancelled by <user>"."""
    code = """
        import gpusched
        held = [gpusched.claim(mem="20G"), gpusched.claim(mem="20G")]  # both cards
        try:
            gpusched.claim(mem="20G", timeout=6)
        except gpusched.NotPlaced as exc:
            print("not placed:", exc.message, flush=True)
            print("reason:", exc.waiting_reason, flush=True)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    message, reason = result.stdout.splitlines()
    job = int(message.split()[3])
    assert "needs 20.0G on 1 GPU" in reason
    assert message.endswith(f"was not placed within 6s: {reason.removeprefix('reason: ')}")
    assert f"gpusched: job {job} waiting: needs 20.0G on 1 GPU" in result.stderr
    withdrawn = daemon.show(job)
    assert (withdrawn["state"], withdrawn["reason"]) == ("cancelled", "cancelled")
    assert withdrawn["reason_detail"].startswith("withdrawn: its process (claim()")
    assert "cancelled by" not in withdrawn["reason_detail"]


@pytest.mark.parametrize(
    "initialise",
    [
        'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")',  # the driver's library is loaded
        # PyTorch says so itself (a stand-in module: torch is not installed here)
        "import sys, types; torch = types.ModuleType('torch');"
        " torch.cuda = types.SimpleNamespace(is_initialized=lambda: True);"
        " sys.modules['torch'] = torch",
    ],
)
def test_claim_after_cuda_was_initialised_is_a_clear_error(
    daemon: RunningDaemon, fake_nvml: FakeNvml, initialise: str
) -> None:
    code = f"""
        {initialise}
        import gpusched
        try:
            gpusched.claim(mem="1G")
        except gpusched.GpuschedError as exc:
            print(type(exc).__name__, exc.message)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=fake_nvml.env(daemon.env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("CudaAlreadyInitialised CUDA is already initialised")
    assert "make it the first cell" in result.stdout
    assert daemon.status()["jobs"] == []  # nothing was queued


def test_an_idle_claim_is_flagged_then_ended(
    daemon_factory: Any, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """A notebook holding memory it does not use: `status` says so; then, once the config
    says `on_idle: end` (reloaded), the daemon stops it, as a forgotten one should be."""
    config = {"poll_interval": "0.5s", "interactive": {"idle_timeout": "3s"}}
    daemon = daemon_factory(simulate=None, config=config, env=fake_nvml.env()).start()
    code = """
        import os, time, gpusched
        from tests.fakenvml import state
        gpu = gpusched.claim(mem="4G")
        state.register_process(os.environ["FAKENVML_STATE"], gpu.gpu_uuids[0], os.getpid(),
                               2 << 30, sm_util=0)   # holds 2G, computes nothing
        print("claimed", gpu.job_id, flush=True)
        time.sleep(60)
    """
    notebook = python(code, daemon.env)
    try:
        job = int(read_line(notebook, "claimed")[1])
        warned = eventually(lambda: daemon.client().job(job).warning, timeout=15)
        assert warned.startswith("idle: no GPU use for ")
        assert warned.endswith("(interactive.idle_timeout 3s)")
        assert notebook.poll() is None  # on_idle: warn (the default) only says so
        settings = yaml.safe_load(daemon.config_path.read_text())
        settings["interactive"]["on_idle"] = "end"
        daemon.config_path.write_text(yaml.safe_dump(settings))
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGHUP)  # reload
        assert notebook.wait(timeout=30) == -signal.SIGTERM  # the process was the job
        ended = daemon.wait_state(job, {"cancelled", "failed", "lost"})
        assert (ended["state"], ended["reason"]) == ("cancelled", "idle")
        assert ended["peak_mem"] == 2 * GiB
    finally:
        notebook.kill()
        notebook.communicate()


def test_claim_and_run_load_no_daemon_side_library() -> None:
    """A notebook's first cell must stay light: no SQLAlchemy, NVML, psutil..."""
    code = (
        "import sys, gpusched, gpusched.cli.run; gpusched.claim;"
        " heavy = ('sqlalchemy', 'pynvml', 'psutil', 'apscheduler', 'prometheus_client');"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


INSIDE_A_JOB = """
    import gpusched
    gpu = gpusched.claim(mem="1G", timeout=30)
    print("claimed", gpu.job_id, gpu.inherited, flush=True)
    gpu.release()
"""


def test_claim_in_a_batch_job_is_the_job_and_a_stale_job_id_is_not(daemon: RunningDaemon) -> None:
    """A script submitted as a job that calls claim() gets its job's GPU; a
    $GPUSCHED_JOB_ID left from a job that has ended queues a claim of its own."""
    job_id = daemon.submit("--mem", "2G", "--", sys.executable, "-c", textwrap.dedent(INSIDE_A_JOB))
    assert daemon.wait_state(job_id, {"done", "failed"})["state"] == "done"
    logs = daemon.cli("logs", str(job_id))
    assert f"claimed {job_id} True" in logs.stdout, logs.stdout + logs.stderr
    assert f"already runs in job {job_id}, which holds GPU" in logs.stdout + logs.stderr

    stale = {**daemon.env, "GPUSCHED_JOB_ID": str(job_id)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(INSIDE_A_JOB)],
        env=stale,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[0] == "claimed" and int(words[1]) > job_id and words[2] == "False", result.stdout
