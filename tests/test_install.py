"""The documented install, done for real: scripts/install.sh with the system Python.

docs/operations.md installs with `sudo scripts/install.sh`: a venv made by the
distribution's `/usr/bin/python3` (Debian 12 and Ubuntu 23.04+ refuse `sudo pip install .`,
PEP 668), the package installed into it from a wheel built from a copy of the checkout
(left for users in PREFIX/share/wheels), and a link on every user's PATH. Here the same
script installs into a scratch prefix (standing for /opt/gpusched) and a scratch bin
directory (for /usr/local/bin), under an administrator's umask of 077; then a throw-away
user runs that install's `gpusched` against a daemon started from it.

The install test fetches the dependencies from PyPI (about a minute): marked `install`, so
a developer may skip it with `-m "not install"`; CI runs it. It needs root (users, and a
daemon that starts jobs as them) and a system Python that can make venvs (python3-venv,
which .ci/run installs).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from tests.daemon_harness import RunningDaemon
from tests.install_harness import (
    REPO,
    SYSTEM_PYTHON,
    Install,
    as_user,
    clean_env,
    installed_daemon_running,
    new_install,
    run_script,
    start_installed_daemon,
)
from tests.users import User, throwaway_users

SCRIPT = REPO / "scripts" / "install.sh"
DOC = REPO / "docs" / "operations.md"
UNIT = REPO / "systemd" / "gpusched.service"


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


@pytest.fixture(scope="module")
def installed() -> Iterator[Install]:
    with new_install() as install:
        yield install


@pytest.fixture(scope="module")
def lab_user() -> Iterator[User]:
    with throwaway_users(1, extra_group=False) as (users, _):
        yield users[0]


@pytest.fixture
def installed_daemon(installed: Install) -> Iterator[RunningDaemon]:
    with installed_daemon_running(installed) as daemon:
        yield daemon


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
        env=clean_env(),
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
def test_the_install_ends_saying_what_to_do_next(installed: Install) -> None:
    """The doc's next steps after the script (config, unit, start, doctor), with this
    install's paths: the script's own prefix and bindir are not the defaults here."""
    steps = [line.strip() for line in installed.said.splitlines() if line.startswith("  ")]
    checkout = installed.checkout
    assert steps == [
        f"sudo install -D -m 0644 {checkout}/config/gpusched.yaml /etc/gpusched/config.yaml",
        f"sudo install -m 0644 {checkout}/systemd/gpusched.service"
        " /etc/systemd/system/gpusched.service",
        f"sudo systemctl edit gpusched   # ExecStart= and ExecReload= at {installed.prefix}"
        "/bin/gpusched: docs/operations.md",
        "sudo systemctl daemon-reload",
        "sudo systemctl enable --now gpusched",
        f"sudo {installed.bindir}/gpusched doctor",
    ], installed.said
    documented = _code(_doc_section("Install"))
    for step in ("sudo systemctl daemon-reload", "sudo systemctl enable --now gpusched"):
        assert step in documented
    assert "doctor" in documented


@pytest.mark.install
def test_the_install_leaves_the_checkout_as_it_was(installed: Install) -> None:
    """Nothing built in the checkout: root-owned gpusched.egg-info or build/ there would
    stop an ordinary user's later `pip install /path/to/gpusched` ("Permission denied")."""
    left = [
        p.name
        for p in installed.checkout.iterdir()
        if p.name.endswith(".egg-info") or p.name in ("build", "dist")
    ]
    assert left == []


@pytest.mark.install
def test_a_user_runs_the_installed_cli_against_the_installed_daemon(
    installed: Install, installed_daemon: RunningDaemon, lab_user: User
) -> None:
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert version
    result = as_user(lab_user, installed, None, "--version")
    assert result.returncode == 0, result.stderr
    assert version.group(1) in result.stdout

    result = as_user(lab_user, installed, installed_daemon, "status")
    assert result.returncode == 0, result.stderr
    assert "24" in result.stdout, result.stdout  # the simulated 24 GB card

    result = as_user(
        lab_user, installed, installed_daemon, "submit", "--mem", "1G", "--", "id", "-u"
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    result = as_user(lab_user, installed, installed_daemon, "wait", job_id)
    assert result.returncode == 0, result.stdout + result.stderr
    result = as_user(lab_user, installed, installed_daemon, "show", "--json", job_id)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "done", job
    result = as_user(lab_user, installed, installed_daemon, "logs", job_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(lab_user.uid)], result.stdout


@pytest.mark.install
def test_upgrade_reinstalls_into_the_same_venv_and_jobs_keep_running(
    installed: Install, installed_daemon: RunningDaemon, lab_user: User
) -> None:
    """docs/operations.md's upgrade: pull, run the script again, restart; a job runs on."""
    go = installed_daemon.root / "go"
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.1; done; echo finished"
    result = as_user(
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
    said = run_script(installed)
    assert "  sudo systemctl restart gpusched\n" in said, said  # what an upgrade needs next
    assert "enable --now" not in said
    installed_init = next(installed.prefix.glob("lib/python3*/site-packages/gpusched/__init__.py"))
    assert installed_init.read_text().endswith(marker)

    installed_daemon.stop()
    start_installed_daemon(installed, installed_daemon)
    assert installed_daemon.show(job_id)["state"] == "running"
    go.touch()
    result = as_user(lab_user, installed, installed_daemon, "wait", str(job_id))
    assert result.returncode == 0, result.stdout + result.stderr
    assert installed_daemon.show(job_id)["state"] == "done"
    result = as_user(lab_user, installed, installed_daemon, "logs", str(job_id))
    assert result.stdout.split() == ["finished"], result.stdout
    result = as_user(lab_user, installed, None, "--version")
    assert result.returncode == 0, result.stderr


@pytest.mark.install
def test_the_installed_daemon_serves_the_dashboard(installed_daemon: RunningDaemon) -> None:
    address = yaml.safe_load(installed_daemon.config_path.read_text())["web"]
    job = installed_daemon.submit("--hold", "--mem", "1G", "--", "true")  # its page is a job's
    pages = ("/", "/queue", f"/job?id={job}", "/usage", "/static/dashboard.js", "/api/status")
    for path in pages:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=15) as response:
            assert response.status == 200, path
            assert response.read(), path
