"""The documented install for tests: scripts/install.sh run by "root" into a scratch prefix
(standing for /opt/gpusched) from a copy of the checkout, the installed daemon started as
the unit starts it, and commands run as a real user would run them.

Used by tests/test_install.py (the server's side) and tests/test_install_client.py (a
user's own environment, from the wheel the install leaves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser import free_port
from tests.daemon_harness import RunningDaemon, answers, eventually
from tests.users import User

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
# The checkout's build leftovers and the developer's caches are not part of a checkout.
NOT_CHECKOUT = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)
# What root's shell has under sudo: none of the test venv's Python on the way.
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Install:
    root: Path
    prefix: Path
    bindir: Path
    checkout: Path
    said: str = ""  # what the script printed on stdout


def system_python_makes_venvs() -> bool:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return False
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True, check=False
    )
    return probe.returncode == 0


def clean_env() -> dict[str, str]:
    """This process's environment (proxies, pip settings) without the test venv in it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = ROOT_PATH
    return env


def run_script(install: Install) -> str:
    """`sudo scripts/install.sh`, by an administrator whose umask is 077: the script must
    still leave an install that every user can read and run. Its stdout."""
    script = install.checkout / "scripts" / "install.sh"
    places = ["--prefix", str(install.prefix), "--bindir", str(install.bindir)]
    result = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$0" "$@"', str(script), *places],
        env=clean_env(),
        cwd=install.root,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@contextlib.contextmanager
def new_install() -> Iterator[Install]:
    """The script run on a copy of this checkout, in a scratch root removed after."""
    if not system_python_makes_venvs():
        pytest.skip(f"{SYSTEM_PYTHON} cannot make venvs: apt-get install python3-venv")
    if os.geteuid() != 0:
        pytest.skip("the install and its daemon need root, as on a server")
    root = Path(tempfile.mkdtemp(prefix="gpusched-install-", dir="/tmp"))
    try:
        root.chmod(0o755)  # every user traverses it, as they do / on a server
        checkout = root / "checkout"
        shutil.copytree(REPO, checkout, ignore=NOT_CHECKOUT)
        install = Install(root, root / "opt" / "gpusched", root / "usr-local-bin", checkout)
        yield dataclasses.replace(install, said=run_script(install))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def start_installed_daemon(installed: Install, daemon: RunningDaemon) -> None:
    """Start the installed `gpusched daemon` as the unit does (root, no test venv around)."""
    gpusched = str(installed.prefix / "bin" / "gpusched")
    with open(daemon.stderr_path, "ab") as stderr:
        daemon.process = subprocess.Popen(
            [gpusched, "daemon", "--config", str(daemon.config_path)],
            env=clean_env(),
            cwd="/",  # as systemd starts it: nothing imported from the test's cwd
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    eventually(lambda: answers(daemon), 20, describe=daemon.stderr)


@contextlib.contextmanager
def installed_daemon_running(installed: Install) -> Iterator[RunningDaemon]:
    """A started daemon from the install, in a fresh directory every user can traverse."""
    run = Path(tempfile.mkdtemp(prefix="run-", dir=installed.root))
    run.chmod(0o755)
    # The harness writes the config (socket, database, state and logs under `run`) and
    # stops the daemon and its jobs; the process is the installed script's, not the venv's.
    # With the dashboard on: its pages are package data, which only an install proves.
    daemon = RunningDaemon(run, simulate="1x24G", config={"web": f"127.0.0.1:{free_port()}"})
    try:
        start_installed_daemon(installed, daemon)
        yield daemon
    finally:
        daemon.stop()
        daemon.kill_jobs()


def user_env(user: User, path: str, daemon: RunningDaemon | None) -> dict[str, str]:
    """What a login gives the user, PATH `path`, and the daemon's socket if one is named."""
    env = {
        "PATH": path,
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
        "LANG": "C.UTF-8",
    }
    if daemon is not None:
        env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
    return env


def run_as(
    user: User, argv: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run argv as the user, in their home, as a login would."""
    return subprocess.run(
        argv,
        env=env,
        cwd=user.home,
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups(),
        umask=0o022,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def as_user(
    user: User, install: Install, daemon: RunningDaemon | None, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `gpusched ARGS` as a user would: found on PATH through the link, in their home."""
    env = user_env(user, f"{install.bindir}:/usr/bin:/bin", daemon)
    return run_as(user, ["gpusched", *args], env)
