"""The client in a user's own environment, from the documented install: no root, and no
package index for gpusched (on PyPI that name is another project's).

scripts/install.sh leaves wheels under PREFIX/share/wheels: gpusched's own, pure Python,
and the client's dependencies (click, PyYAML). A throw-away user makes a venv with the
system Python, installs the client with docs/operations.md's command plus `--no-index`
(so nothing comes from an index), then claims a GPU from the installed root daemon in a
plain Python and in a Jupyter kernel made by `gpusched kernel install`, driven through
jupyter_client in the user's own venv. Only ipykernel, the notebook's own need, comes from
the index the user's pip is set up with.

Marked `install` with tests/test_install.py: it runs the install (about a minute) and
needs root for the users and the daemon.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import RunningDaemon
from tests.install_harness import (
    REPO,
    Install,
    installed_daemon_running,
    new_install,
    run_as,
    user_env,
)
from tests.users import User, throwaway_users

pytestmark = pytest.mark.install

DOC = REPO / "docs" / "operations.md"
DOC_PREFIX = "/opt/gpusched"
KERNEL = "gpusched-1g"


@pytest.fixture(scope="module")
def installed() -> Iterator[Install]:
    with new_install() as install:
        yield install


@pytest.fixture(scope="module")
def student() -> Iterator[User]:
    with throwaway_users(1, extra_group=False) as (users, _):
        yield users[0]


@pytest.fixture(scope="module")
def installed_daemon(installed: Install) -> Iterator[RunningDaemon]:
    with installed_daemon_running(installed) as daemon:
        yield daemon


def documented_client_install() -> str:
    """docs/operations.md's line that installs the client from the install's wheels."""
    lines = re.findall(rf"^pip install .*{DOC_PREFIX}/share/wheels.*$", DOC.read_text(), re.M)
    assert len(lines) == 1, lines
    return lines[0].split("#")[0].strip()


def in_venv(user: User, venv: Path, daemon: RunningDaemon | None, command: str) -> str:
    """`sh -c COMMAND` as the user with the venv activated; its stdout (it must succeed)."""
    env = user_env(user, f"{venv}/bin:/usr/bin:/bin", daemon)
    env["VIRTUAL_ENV"] = str(venv)
    # The user's pip reaches an index as this machine allows (proxies, pip's own settings).
    env |= {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}
    done = run_as(user, ["sh", "-c", command], env, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(installed: Install, student: User) -> Path:
    """The student's fresh venv with the client installed as the docs say, offline."""
    made = Path(student.home) / "gpu-env"
    command = documented_client_install().replace(DOC_PREFIX, str(installed.prefix))
    offline = command.replace("pip install ", "pip install --no-index ", 1)
    in_venv(student, made, None, f"/usr/bin/python3 -m venv {made}")
    in_venv(student, made, None, offline)
    return made


def test_the_wheel_installs_the_light_client_without_an_index(
    installed: Install, venv: Path, student: User
) -> None:
    wheels = sorted(p.name for p in (installed.prefix / "share" / "wheels").iterdir())
    assert [w for w in wheels if w.startswith("gpusched-")] == ["gpusched-0.1.0-py3-none-any.whl"]
    code = """
        import importlib.util, gpusched, click, yaml
        print(gpusched.__file__)
        print([m for m in ("sqlalchemy", "apscheduler", "pynvml", "psutil")
               if importlib.util.find_spec(m)])
    """
    printed = in_venv(student, venv, None, f"python -c '{textwrap.dedent(code)}'").splitlines()
    assert printed[0].startswith(f"{venv}/lib/"), printed  # the user's own copy
    assert printed[1] == "[]", printed  # none of the daemon's dependencies
    assert "gpusched, version 0.1.0" in in_venv(student, venv, None, "gpusched --version")


def test_the_users_python_claims_a_gpu_from_the_root_daemon(
    installed_daemon: RunningDaemon, venv: Path, student: User
) -> None:
    code = """
        import os, gpusched
        with gpusched.claim(mem="1G", timeout=60) as gpu:
            print(gpu.job_id, os.environ["CUDA_VISIBLE_DEVICES"])
    """
    printed = in_venv(student, venv, installed_daemon, f"python -c '{textwrap.dedent(code)}'")
    job_id, visible = printed.split()
    job = installed_daemon.show(int(job_id))
    assert (job["state"], job["uid"], job["mem"]) == ("done", student.uid, 1 << 30), job
    assert visible == "0"


# Run by the user's own Python: jupyter_client (which ipykernel brings) starts the kernel
# from its spec as JupyterLab would, and the first cell claims the GPU.
DRIVER = """
import json, sys
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

CELL = '''
import os, gpusched
kernel = os.environ["GPUSCHED_JOB_ID"]  # the kernel's job, from its start
gpu = gpusched.claim(mem="1G", timeout=30)
print("claimed", gpu.job_id, kernel, gpusched.__file__)
'''
specs = KernelSpecManager(kernel_dirs=[sys.argv[1]])
manager = KernelManager(kernel_name=sys.argv[2], kernel_spec_manager=specs)
manager.start_kernel()
client = manager.client()
client.start_channels()
printed = []
def keep(message):
    if message["header"]["msg_type"] == "stream":
        printed.append(message["content"]["text"])
try:
    client.wait_for_ready(timeout=60)
    reply = client.execute_interactive(CELL, output_hook=keep, timeout=60)
finally:
    client.stop_channels()
    manager.shutdown_kernel()
print(json.dumps({"status": reply["content"]["status"], "printed": "".join(printed)}))
"""


def test_a_kernel_in_the_users_env_imports_gpusched_and_keeps_its_one_gpu(
    installed_daemon: RunningDaemon, venv: Path, student: User
) -> None:
    in_venv(student, venv, None, "pip install --quiet ipykernel")
    installed = in_venv(
        student,
        venv,
        installed_daemon,
        f"gpusched kernel install --mem 1G --python {venv}/bin/python --prefix {venv}",
    )
    assert installed.startswith(f"installed kernel {KERNEL} in {venv}/"), installed
    driver = Path(student.home) / "driver.py"
    driver.write_text(DRIVER)
    env_dirs = f"JUPYTER_PLATFORM_DIRS=1 python {driver} {venv}/share/jupyter/kernels {KERNEL}"
    result = json.loads(in_venv(student, venv, installed_daemon, env_dirs).splitlines()[-1])
    assert result["status"] == "ok", result
    claimed = next(line for line in result["printed"].splitlines() if line.startswith("claimed"))
    _, job_id, kernel_job, module = claimed.split()
    assert job_id == kernel_job, claimed  # the kernel's own job, not a second one
    assert module.startswith(f"{venv}/lib/"), module
    ended = installed_daemon.wait_state(int(job_id), {"done", "failed", "cancelled", "lost"})
    assert (ended["state"], ended["name"], ended["uid"]) == (
        "done",
        f"kernel {KERNEL}",
        student.uid,
    )
    # The claim queued nothing: no job came after the kernel's.
    later = installed_daemon.cli("show", str(int(job_id) + 1))
    assert later.returncode != 0, later.stdout
