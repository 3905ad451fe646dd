"""The client in a user's own environment (issue 28, item 1): the package without extras
(the wheel scripts/install.sh leaves for users) brings only click and PyYAML, and the
CLI, `gpusched.Client`, `gpusched.claim()` and `gpusched kernel install` work with nothing
else; `gpusched daemon` there says what to install.

The light environment is built without the network: Python with no site-packages (-S),
then only gpusched, click and yaml on its path.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
import yaml

import gpusched
from tests.daemon_harness import RunningDaemon

REPO = Path(gpusched.__file__).resolve().parent.parent


def test_the_package_requires_only_click_and_pyyaml() -> None:
    required = importlib.metadata.requires("gpusched") or []
    plain = {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in required if "extra ==" not in r}
    assert plain == {"click", "pyyaml"}
    extras = {r for r in required if 'extra == "daemon"' in r}
    assert any(r.startswith("sqlalchemy") for r in extras), extras


@pytest.fixture
def light_path(tmp_path: Path) -> Path:
    made = tmp_path / "light"
    made.mkdir()
    for module in (gpusched, click, yaml):
        (made / module.__name__).symlink_to(Path(str(module.__file__)).parent)
    return made


def light_python(light: Path, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.path.insert(0, {str(light)!r})\n"
    return subprocess.run(
        [sys.executable, "-S", "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )


def test_cli_client_and_claim_work_with_click_and_yaml_alone(
    daemon: RunningDaemon, light_path: Path
) -> None:
    code = """
        import sys
        try:
            import sqlalchemy
        except ImportError:
            pass
        else:
            raise SystemExit("sqlalchemy is reachable: not a light environment")
        import gpusched
        from gpusched.cli import cli
        gpu = gpusched.claim(mem="1G")
        print("claimed", gpu.job_id, flush=True)
        gpu.release()
        print(len(gpusched.Client().status().gpus), "gpus", flush=True)
        try:
            cli.main(["status"], prog_name="gpusched")
        except SystemExit as exc:
            print("status exit", exc.code, flush=True)
    """
    done = light_python(light_path, code, daemon.env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("claimed ")
    assert "2 gpus" in lines
    assert lines[-1] == "status exit 0", done.stdout


def test_the_daemon_in_a_light_environment_says_what_to_install(light_path: Path) -> None:
    code = """
        from gpusched.cli import cli
        cli.main(["daemon", "--simulate", "1x8G"], prog_name="gpusched")
    """
    done = light_python(light_path, code, {"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert done.returncode == 2, done.stderr
    assert "pip install '/path/to/gpusched[daemon]'" in done.stderr
    assert "pip install 'gpusched" not in done.stderr  # on PyPI that name is another project
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
