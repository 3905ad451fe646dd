"""Notebooks through the queue (issue 28): `gpusched kernel install` writes a kernelspec,
and a real ipykernel started from it through jupyter_client (as JupyterLab starts
kernels) gets its GPU from a real daemon, runs code that sees CUDA_VISIBLE_DEVICES, and
gives the GPU back when it shuts down. A kernel waiting in the queue is not ready yet, and
becomes ready once placed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")


@pytest.fixture
def kernel_env(daemon: RunningDaemon, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {
        **daemon.env,
        "HOME": str(home),
        "JUPYTER_PLATFORM_DIRS": "1",  # jupyter_core's future paths, without its warning
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
    }


def install(daemon: RunningDaemon, env: dict[str, str], *args: str) -> Path:
    done = daemon.cli("kernel", "install", "--python", sys.executable, *args, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("installed kernel "), done.stdout
    return Path(done.stdout.split()[4].rstrip(":"))


def run_code(client: Any, code: str) -> str:
    printed: list[str] = []

    def keep(message: dict[str, Any]) -> None:
        if message["header"]["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    reply = client.execute_interactive(code, output_hook=keep, timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(printed)


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Kernel managers to shut down whatever the test did."""
    managers: list[Any] = []
    yield managers
    for manager in managers:
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)


def start(directory: Path, env: dict[str, str], managers: list[Any]) -> Any:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    specs = KernelSpecManager(kernel_dirs=[str(directory.parent)])
    manager = KernelManager(kernel_name=directory.name, kernel_spec_manager=specs)
    manager.start_kernel(env=env)
    managers.append(manager)
    return manager


def kernel_id(daemon: RunningDaemon, name: str) -> int | None:
    """The kernel's job id, once it is queued."""
    jobs = [j["id"] for j in daemon.status("--all")["jobs"] if j["name"] == f"kernel {name}"]
    return jobs[0] if jobs else None


def kernel_job(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    jobs = [j for j in daemon.status("--all")["jobs"] if j["name"] == f"kernel {name}"]
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_the_spec_runs_the_users_python_through_gpusched_run(
    daemon: RunningDaemon, kernel_env: dict[str, str]
) -> None:
    directory = install(daemon, kernel_env, "--mem", "8G")
    assert directory == Path(kernel_env["HOME"]) / ".local/share/jupyter/kernels/gpusched-8g"
    spec = json.loads((directory / "kernel.json").read_text())
    argv = spec["argv"]
    assert argv[argv.index("run") :][:3] == ["run", "--mem", "8G"]
    assert argv[-5:] == [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["language"] == "python"
    refused = daemon.cli("kernel", "install", "--name", "no spaces", env=kernel_env)
    assert refused.returncode == 2 and "kernel name" in refused.stderr


def test_a_kernel_gets_its_gpu_from_the_queue_and_gives_it_back(
    daemon: RunningDaemon, kernel_env: dict[str, str], tmp_path: Path, started: list[Any]
) -> None:
    directory = install(daemon, kernel_env, "--mem", "8G", "--prefix", str(tmp_path / "venv"))
    assert directory == tmp_path / "venv/share/jupyter/kernels/gpusched-8g"
    manager = start(directory, kernel_env, started)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        job = kernel_job(daemon, "gpusched-8g")
        assert (job["state"], job["mem"], job["interactive"]) == ("running", 8 << 30, True)
        seen = run_code(client, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
        assert seen.strip() == ",".join(map(str, job["gpu_indices"]))
    finally:
        client.stop_channels()
    manager.shutdown_kernel()
    ended = daemon.wait_state(job["id"], {"done", "failed", "cancelled", "lost"})
    assert ended["state"] == "done", ended


def test_a_waiting_kernel_is_not_ready_until_placed(
    daemon: RunningDaemon, kernel_env: dict[str, str], started: list[Any]
) -> None:
    blockers = [daemon.submit("--", "sleep", "600") for _ in range(2)]  # both whole GPUs
    for blocker in blockers:
        daemon.wait_state(blocker, {"running"})
    directory = install(daemon, kernel_env, "--mem", "4G", "--name", "waits")
    manager = start(directory, kernel_env, started)
    client = manager.client()
    client.start_channels()
    try:
        job_id = eventually(lambda: kernel_id(daemon, "waits") or 0, 30)
        waiting = daemon.wait_reason(job_id, "GPU")["waiting_reason"]
        assert "4.0G" in waiting, waiting
        with pytest.raises(RuntimeError):
            client.wait_for_ready(timeout=2)
        assert manager.is_alive()  # waiting, not dead
        for blocker in blockers:
            daemon.cli("cancel", str(blocker))
        client.wait_for_ready(timeout=60)
        assert run_code(client, "print(1 + 1)").strip() == "2"
    finally:
        client.stop_channels()
    manager.shutdown_kernel()
    job = kernel_job(daemon, "waits")
    assert daemon.wait_state(job["id"], {"done", "failed", "lost"})["state"] == "done"


INSIDE_THE_KERNEL = """
import os
import gpusched
gpu = gpusched.claim(mem="4G", timeout=20)
print("claimed", gpu.job_id, getattr(gpu, "inherited", None), os.environ["CUDA_VISIBLE_DEVICES"])
try:
    gpusched.claim(mem="16G", timeout=20)
except gpusched.ClaimInsideJob as refused:
    print("refused:", refused)
gpu.release()
print("released", gpu)
"""


def test_claim_inside_a_kernel_returns_the_kernels_own_gpu(
    daemon: RunningDaemon, kernel_env: dict[str, str], started: list[Any]
) -> None:
    """The kernel holds its card already: claim() there hands it over instead of queueing
    a second job, refuses more than the kernel holds, and its release leaves the card to
    the kernel."""
    directory = install(daemon, kernel_env, "--mem", "8G", "--name", "holds")
    manager = start(directory, kernel_env, started)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        job = kernel_job(daemon, "holds")
        printed = run_code(client, INSIDE_THE_KERNEL)
    finally:
        client.stop_channels()
    visible = ",".join(map(str, job["gpu_indices"]))
    assert f"claimed {job['id']} True {visible}\n" in printed, printed
    assert f"already runs in job {job['id']} (kernel holds)" in printed, printed
    refused = printed.split("refused: ", 1)[1].splitlines()[0]
    assert "holds GPU" in refused and "with 8G" in refused and "1 GPU with 16G" in refused
    assert "gpusched kernel install --mem SIZE" in refused, refused
    # No second reservation was ever queued, and the release left the kernel's job running.
    assert [j["id"] for j in daemon.status("--all")["jobs"]] == [job["id"]]
    assert daemon.show(job["id"])["state"] == "running"
    manager.shutdown_kernel()
    ended = daemon.wait_state(job["id"], {"done", "failed", "cancelled", "lost"})
    assert ended["state"] == "done", ended
