"""The Python API: README's example runs against a real daemon, and prints what README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched import Client
from gpusched.core.errors import UsageError
from gpusched.core.models import Job
from tests.daemon_harness import RunningDaemon

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_example() -> tuple[str, str]:
    """The ```python block that uses Client, and the ```console block right after it."""
    text = README.read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, flags=re.DOTALL)
    for i, (lang, code) in enumerate(blocks):
        if lang == "python" and "from gpusched import Client" in code:
            following = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            assert following[0] == "console", "README: show the example's output after it"
            return code, following[1]
    raise AssertionError("README.md has no Python API example")


def _shape(text: str) -> list[str]:
    """Lines with numbers blanked: job ids and pids differ from run to run."""
    return [re.sub(r"\d+(\.\d+)?", "N", line) for line in text.strip().splitlines()]


def test_readme_python_example_runs_against_a_real_daemon(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    code, shown = _readme_example()
    script = tmp_path / "example.py"
    script.write_text(code)
    # `python` in the example is the submitter's: this interpreter's directory comes first.
    env = {**daemon.env, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _shape(done.stdout) == _shape(shown), done.stdout


def test_wait_takes_one_id_or_a_list_and_notify_is_split_without_a_shell(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    client = Client(daemon.socket_path)
    job = client.submit(["true"], mem="1G", cwd=tmp_path)
    assert isinstance(client.wait(job.id, timeout=20), Job)
    jobs = client.wait([job.id], timeout=20)
    assert [j.state for j in jobs] == ["done"]
    assert client.ping()["daemon_uid"] == os.geteuid()
    with pytest.raises(UsageError, match="--notify"):
        client.submit(["true"], mem="1G", notify="  ")
