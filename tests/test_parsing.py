"""One size parser and one duration parser at every entry point (issue 24, "Parsing" and
finding 10): the real `gpusched` command, the Python client, the config file, and the
daemon's own check of a raw request.

What each entry point must do alike: a size without a unit is refused with a one-line hint;
a job's --mem under 256M is refused (smaller than a CUDA context); a 400-digit number is
one line, no traceback; `--time 1e9` says it is too long; `--time 0.0001ms` is refused (a
job's time limit is at least 1s); 8G, 8Gi and 8GiB are the same 2**30-based size; 1e3M is
accepted. In Python an int `mem=` is bytes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched import Client
from gpusched.config.settings import load_config
from gpusched.core.errors import ConfigError, UsageError
from gpusched.interactive.reservation import queue
from tests.daemon_harness import RunningDaemon

GiB = 2**30
MiB = 2**20
HUGE = "1" * 400

# (option value, what the one line must say)
REFUSED_MEM = [
    ("8", "--mem 8: add a unit, e.g. 8G"),
    ("100M", "--mem 100M: at least 256M"),
    ("1M", "--mem 1M: at least 256M"),
    (HUGE, "--mem 111111111111... (400 characters): add a unit"),
    (HUGE + "G", "too large"),
]
REFUSED_TIME = [
    ("1e9", "--time 1e9: too long"),
    ("0.0001ms", "--time 0.0001ms: too short (at least 1s)"),
    (HUGE, "too long"),
    ("0", "must be more than zero"),
]


def _gpusched(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real command, pointed at no daemon: every refusal here comes before the socket."""
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "GPUSCHED_SOCKET": str(tmp_path / "none.sock")},
        check=False,
    )


def _one_line_refusal(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert expected in result.stderr


@pytest.mark.parametrize("verb", ["submit", "run"])
@pytest.mark.parametrize(("value", "expected"), REFUSED_MEM)
def test_the_cli_refuses_a_bad_mem_in_one_line(
    tmp_path: Path, verb: str, value: str, expected: str
) -> None:
    _one_line_refusal(_gpusched(verb, "--mem", value, "--", "true", tmp_path=tmp_path), expected)


@pytest.mark.parametrize("verb", ["submit", "run"])
@pytest.mark.parametrize(("value", "expected"), REFUSED_TIME)
def test_the_cli_refuses_a_bad_time_in_one_line(
    tmp_path: Path, verb: str, value: str, expected: str
) -> None:
    result = _gpusched(verb, "--mem", "1G", "--time", value, "--", "true", tmp_path=tmp_path)
    _one_line_refusal(result, expected)


@pytest.mark.parametrize(
    ("mem", "expected"),
    [
        ("8", "mem 8: add a unit, e.g. 8G"),
        (HUGE, "add a unit"),
        (10**400, "too large"),
        (MiB, "at least 256M"),  # an int is bytes: 1 MiB is too small for a job
        (True, "expected a size"),
    ],
)
def test_the_client_refuses_a_bad_mem_in_one_line(
    tmp_path: Path, mem: object, expected: str
) -> None:
    client = Client(tmp_path / "none.sock")
    with pytest.raises(UsageError) as info:
        client.submit(["true"], mem=mem)  # type: ignore[arg-type]
    assert expected in info.value.message
    assert "\n" not in info.value.message


@pytest.mark.parametrize(
    ("mem", "time_limit", "expected"),
    [("8", None, "mem 8: add a unit"), (MiB, None, "at least 256M"), ("1G", "1e9", "too long")],
)
def test_an_interactive_claim_refuses_bad_sizes_before_asking(
    tmp_path: Path, mem: object, time_limit: object, expected: str
) -> None:
    """`gpusched run` and `gpusched.claim()` queue through reservation.queue."""
    with pytest.raises(UsageError, match=expected):
        queue(Client(tmp_path / "none.sock"), ["true"], mem=mem, time_limit=time_limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("time_limit", "expected"),
    [("1e9", "too long"), (1e9, "too long"), ("0.0001ms", "too short"), (HUGE, "too long")],
)
def test_the_client_refuses_a_bad_time_limit_in_one_line(
    tmp_path: Path, time_limit: object, expected: str
) -> None:
    client = Client(tmp_path / "none.sock")
    with pytest.raises(UsageError, match=expected):
        client.submit(["true"], mem="1G", time_limit=time_limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"headroom": "8"}, "key 'headroom': invalid size '8': add a unit, e.g. 8G"),
        ({"headroom": HUGE}, "key 'headroom': invalid size '111111111111... (400 characters)'"),
        ({"headroom": int(HUGE)}, "too large"),  # YAML reads 400 digits as an int
        ({"max_log_size": HUGE + "M"}, "too large"),
        ({"limits": {"default": {"max_mem": "20"}}}, "add a unit"),
        ({"poll_interval": "1e9"}, "too long"),
        ({"poll_interval": "0.0001ms"}, "too short (at least 1ms)"),
    ],
)
def test_a_config_size_or_duration_is_refused_in_one_line(
    settings: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, settings)
    assert expected in info.value.message
    assert "\n" not in info.value.message


def test_the_daemon_refuses_a_config_with_a_400_digit_size_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gpusched.yaml"
    config.write_text(f"headroom: {HUGE}\n")
    result = _gpusched("daemon", "--config", str(config), tmp_path=tmp_path)
    _one_line_refusal(result, "key 'headroom'")
    assert "too large" in result.stderr


def test_config_sizes_take_every_spelling_of_the_binary_units() -> None:
    for text in ("1G", "1Gi", "1GiB", "1gb", "1024M", "1e3M"):
        expected = 1000 * MiB if text == "1e3M" else GiB
        assert load_config(None, {"headroom": text}).headroom_bytes == expected, text


def test_sizes_are_one_meaning_wherever_they_enter(daemon: RunningDaemon) -> None:
    """8G, 8Gi and 8GiB are all 8 * 2**30 (as NVML counts); 1e3M is 1000 MiB; an int is bytes."""
    ids = {
        text: int(daemon.submit("--hold", "--mem", text, "--", "true"))
        for text in ("8G", "8Gi", "8GiB", "1e3M")
    }
    mems = {text: daemon.show(job_id)["mem"] for text, job_id in ids.items()}
    assert mems == {"8G": 8 * GiB, "8Gi": 8 * GiB, "8GiB": 8 * GiB, "1e3M": 1000 * MiB}
    client = Client(daemon.socket_path)
    assert client.submit(["true"], mem=3 * GiB, hold=True).mem == 3 * GiB
    for text in ("3G", "3Gi", "3GiB"):
        assert client.submit(["true"], mem=text, hold=True, time_limit="1s").mem == 3 * GiB
    assert client.submit(["true"], mem="1e3M", hold=True).mem == 1000 * MiB


def _raw_request(socket_path: Path, request: dict[str, object]) -> str:
    """One request line sent as any program could, past every client-side check."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(socket_path))
        conn.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            assert chunk, data
            data += chunk
    return data.decode()


def test_the_daemon_itself_refuses_a_raw_request_under_256m_or_a_bad_time(
    daemon: RunningDaemon,
) -> None:
    """A client that skips the parser (the socket is a public interface) is refused too."""
    base = {"op": "submit", "command": ["true"], "cwd": "/", "env": {}, "hold": True}
    for extra, expected in (
        ({"mem": 1}, "at least 256M"),
        ({"mem": 8}, "at least 256M"),
        ({"mem": GiB, "time": 1e9}, "too long"),
        ({"mem": GiB, "time": 0.0001}, "too short"),
    ):
        answer = _raw_request(daemon.socket_path, {**base, **extra})
        assert expected in answer, answer
        assert "Traceback" not in answer
    assert daemon.status("--all")["jobs"] == []  # none of them was queued
