"""The Python API: README's example runs against a real daemon, and prints what README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpusched import Client
from gpusched.core.errors import UsageError
from gpusched.core.models import Job
from gpusched.core.requests.views import StatusRequest
from gpusched.core.status_pages import ACTIVE_STATE_NAMES, status_wire
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


@pytest.mark.parametrize(
    ("asked", "request_"),
    [
        ({}, StatusRequest()),
        ({"all": True, "ended": 20}, StatusRequest(all=True, ended=20)),
        ({"states": ["running"], "first": 1}, StatusRequest(states=("running",), limit=1)),
        (
            {"states": ["queued", "held"], "first": 200, "user": "alice"},
            StatusRequest(states=("queued", "held"), limit=200, user="alice"),
        ),
        ({"all": True, "ended": 1000}, StatusRequest(all=True, ended=1000)),
        ({"first": 0}, StatusRequest(limit=1)),
    ],
)
def test_the_status_frame_is_the_requests(asked: dict[str, Any], request_: StatusRequest) -> None:
    """`Client.status_reply` sends `status` without the request dataclass: the same frame,
    the same refusals."""
    assert {"op": "status", **status_wire(**asked)} == request_.to_wire()


@pytest.mark.parametrize("asked", [{"ended": 0}, {"states": ["done"]}, {"states": ["x"]}])
def test_a_status_frame_refuses_what_the_request_refuses(asked: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as frame:
        status_wire(**asked)
    wanted: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in asked.items()}
    with pytest.raises(UsageError) as request:
        StatusRequest(**wanted)
    assert str(frame.value) == str(request.value)


def test_the_active_state_names_are_the_models() -> None:
    from gpusched.core.models import ACTIVE_STATES

    assert {str(s) for s in ACTIVE_STATES} == ACTIVE_STATE_NAMES
