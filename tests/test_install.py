"""The documented install, done for real: scripts/install.sh with the system Python.

docs/operations.md installs with `sudo scripts/install.sh`: a venv made by the
distribution's `/usr/bin/python3` (Debian 12 and Ubuntu 23.04+ refuse `sudo pip install .`,
PEP 668), the package installed into it from the checkout, and a link on every user's
PATH. Here the same script installs into a scratch prefix (standing for /opt/gpusched) and
a scratch bin directory (for /usr/local/bin), under an administrator's umask of 077; then a
throw-away user runs that install's `gpusched` against a daemon started from it.

The install test fetches the dependencies from PyPI (about a minute): marked `install`, so
a developer may skip it with `-m "not install"`; CI runs it. It needs root (users, and a
daemon that starts jobs as them) and a system Python that can make venvs (python3-venv,
which .ci/run installs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.browser import free_port
from tests.daemon_harness import RunningDaemon, answers, eventually
from tests.users import User, throwaway_users

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install.sh"
DOC = REPO / "docs" / "operations.md"
UNIT = REPO / "systemd" / "gpusched.service"
SYSTEM_PYTHON = "/usr/bin/python3"
# The checkout's build leftovers and the developer's caches are not part of a checkout.
NOT_CHECKOUT = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)
# What root's shell has under sudo: none of the test venv's Python on the way.
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _script_default(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"scripts/install.sh has no default for {name}"
    return match.group(1)


def _doc_section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", DOC.read_text(), re.M | re.S)
    assert match, f"docs/operations.md has no section {title!r}"
    return match.group(1)


def _code(section: str) -> str:
    return "\n".join(re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S))


def test_doc_and_unit_use_the_script_and_its_prefix() -> None:
    """The doc's install and upgrade run the script this file tests; the unit, the uninstall
    and the link name the script's own default places."""
    prefix, bindir = _script_default("prefix"), _script_default("bindir")
    # The install test passes only the scratch places: the Python is the documented one.
    assert _script_default("python") == SYSTEM_PYTHON
    assert "sudo scripts/install.sh" in _code(_doc_section("Install"))
    assert "sudo scripts/install.sh" in _code(_doc_section("Upgrade without killing jobs"))
    assert "sudo pip install" not in _code(_doc_section("Install"))
    uninstall = _code(_doc_section("Uninstall"))
    assert f"sudo rm -r {prefix}" in uninstall
    assert f"sudo rm {bindir}/gpusched" in uninstall
    exec_start = re.search(r"^ExecStart=(\S+)", UNIT.read_text(), re.M)
    assert exec_start
    assert exec_start.group(1) == f"{prefix}/bin/gpusched"


@dataclass(frozen=True)
class Install:
    root: Path
    prefix: Path
    bindir: Path
    checkout: Path


def _system_python_makes_venvs() -> bool:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return False
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True, check=False
    )
    return probe.returncode == 0


def _clean_env() -> dict[str, str]:
    """This process's environment (proxies, pip settings) without the test venv in it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = ROOT_PATH
    return env


def _run_script(install: Install) -> None:
    """`sudo scripts/install.sh`, by an administrator whose umask is 077: the script must
    still leave an install that every user can read and run."""
    script = install.checkout / "scripts" / "install.sh"
    places = ["--prefix", str(install.prefix), "--bindir", str(install.bindir)]
    result = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$0" "$@"', str(script), *places],
        env=_clean_env(),
        cwd=install.root,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def installed() -> Iterator[Install]:
    if not _system_python_makes_venvs():
        pytest.skip(f"{SYSTEM_PYTHON} cannot make venvs: apt-get install python3-venv")
    if os.geteuid() != 0:
        pytest.skip("the install and its daemon need root, as on a server")
    root = Path(tempfile.mkdtemp(prefix="gpusched-install-", dir="/tmp"))
    try:
        root.chmod(0o755)  # every user traverses it, as they do / on a server
        checkout = root / "checkout"
        shutil.copytree(REPO, checkout, ignore=NOT_CHECKOUT)
        install = Install(root, root / "opt" / "gpusched", root / "usr-local-bin", checkout)
        _run_script(install)
        yield install
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def lab_user() -> Iterator[User]:
    with throwaway_users(1, extra_group=False) as (users, _):
        yield users[0]


def _start_installed_daemon(installed: Install, daemon: RunningDaemon) -> None:
    """Start the installed `gpusched daemon` as the unit does (root, no test venv around)."""
    gpusched = str(installed.prefix / "bin" / "gpusched")
    with open(daemon.stderr_path, "ab") as stderr:
        daemon.process = subprocess.Popen(
            [gpusched, "daemon", "--config", str(daemon.config_path)],
            env=_clean_env(),
            cwd="/",  # as systemd starts it: nothing imported from the test's cwd
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    eventually(lambda: answers(daemon), 20, describe=daemon.stderr)


@pytest.fixture
def installed_daemon(installed: Install) -> Iterator[RunningDaemon]:
    """A started daemon from the install, in a fresh directory every user can traverse."""
    run = Path(tempfile.mkdtemp(prefix="run-", dir=installed.root))
    run.chmod(0o755)
    # The harness writes the config (socket, database, state and logs under `run`) and
    # stops the daemon and its jobs; the process is the installed script's, not the venv's.
    # With the dashboard on: its pages are package data, which only an install proves.
    daemon = RunningDaemon(run, simulate="1x24G", config={"web": f"127.0.0.1:{free_port()}"})
    try:
        _start_installed_daemon(installed, daemon)
        yield daemon
    finally:
        daemon.stop()
        daemon.kill_jobs()


def _as_user(
    user: User, install: Install, daemon: RunningDaemon | None, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `gpusched ARGS` as a user would: found on PATH through the link, in their home."""
    env = {
        "PATH": f"{install.bindir}:/usr/bin:/bin",
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
        "LANG": "C.UTF-8",
    }
    if daemon is not None:
        env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
    return subprocess.run(
        ["gpusched", *args],
        env=env,
        cwd=user.home,
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups(),
        umask=0o022,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.install
def test_install_is_a_venv_every_user_can_read(installed: Install) -> None:
    link = installed.bindir / "gpusched"
    assert link.is_symlink()
    assert os.readlink(link) == str(installed.prefix / "bin" / "gpusched")
    # Not editable: the installed package does not run code from the checkout.
    where = subprocess.run(
        [
            str(installed.prefix / "bin" / "python"),
            "-c",
            "import gpusched; print(gpusched.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
        cwd="/",  # not the test's cwd (the checkout), which `python -c` would import from
    ).stdout
    assert where.startswith(str(installed.prefix)), where
    # The docs the unit's Documentation= names.
    assert (installed.prefix / "share" / "doc" / "gpusched" / "operations.md").is_file()
    unreadable = []
    for path in [installed.prefix, *installed.prefix.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            unreadable.append(f"{stat.filemode(mode)} {path}")
    assert not unreadable, unreadable[:10]


@pytest.mark.install
def test_a_user_runs_the_installed_cli_against_the_installed_daemon(
    installed: Install, installed_daemon: RunningDaemon, lab_user: User
) -> None:
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert version
    result = _as_user(lab_user, installed, None, "--version")
    assert result.returncode == 0, result.stderr
    assert version.group(1) in result.stdout

    result = _as_user(lab_user, installed, installed_daemon, "status")
    assert result.returncode == 0, result.stderr
    assert "24" in result.stdout, result.stdout  # the simulated 24 GB card

    result = _as_user(
        lab_user, installed, installed_daemon, "submit", "--mem", "1G", "--", "id", "-u"
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    result = _as_user(lab_user, installed, installed_daemon, "wait", job_id)
    assert result.returncode == 0, result.stdout + result.stderr
    result = _as_user(lab_user, installed, installed_daemon, "show", "--json", job_id)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "done", job
    result = _as_user(lab_user, installed, installed_daemon, "logs", job_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(lab_user.uid)], result.stdout


@pytest.mark.install
def test_upgrade_reinstalls_into_the_same_venv_and_jobs_keep_running(
    installed: Install, installed_daemon: RunningDaemon, lab_user: User
) -> None:
    """docs/operations.md's upgrade: pull, run the script again, restart; a job runs on."""
    go = installed_daemon.root / "go"
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.1; done; echo finished"
    result = _as_user(
        lab_user,
        installed,
        installed_daemon,
        "submit",
        "--mem",
        "1G",
        "--",
        "sh",
        "-c",
        wait_for_go,
    )
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout.strip())
    installed_daemon.wait_state(job_id, {"running"})

    # A new version in the checkout (as after `git pull`), with the same version number:
    # the reinstall must still replace the installed code.
    marker = f"# upgraded {os.urandom(4).hex()}\n"
    init = installed.checkout / "gpusched" / "__init__.py"
    init.write_text(init.read_text() + marker)
    _run_script(installed)
    installed_init = next(installed.prefix.glob("lib/python3*/site-packages/gpusched/__init__.py"))
    assert installed_init.read_text().endswith(marker)

    installed_daemon.stop()
    _start_installed_daemon(installed, installed_daemon)
    assert installed_daemon.show(job_id)["state"] == "running"
    go.touch()
    result = _as_user(lab_user, installed, installed_daemon, "wait", str(job_id))
    assert result.returncode == 0, result.stdout + result.stderr
    assert installed_daemon.show(job_id)["state"] == "done"
    result = _as_user(lab_user, installed, installed_daemon, "logs", str(job_id))
    assert result.stdout.split() == ["finished"], result.stdout
    result = _as_user(lab_user, installed, None, "--version")
    assert result.returncode == 0, result.stderr


@pytest.mark.install
def test_the_installed_daemon_serves_the_dashboard(installed_daemon: RunningDaemon) -> None:
    address = yaml.safe_load(installed_daemon.config_path.read_text())["web"]
    for path in ("/", "/queue", "/job?id=1", "/usage", "/static/dashboard.js", "/api/status"):
        with urllib.request.urlopen(f"http://{address}{path}", timeout=15) as response:
            assert response.status == 200, path
            assert response.read(), path
