"""One daemon per server (issue 28, item 2): where a system service is installed, a user's
client talks to it even when a personal daemon's socket is there too, says so (and asks
again) while the service restarts, and a personal daemon refuses to drive the machine's
real GPUs beside it.

Real daemons and real users. The "system service" is a root daemon whose socket
$GPUSCHED_SYSTEM_SOCKET points at (tests never touch /run/gpusched).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import DaemonUnreachable
from gpusched.daemon_socket import refuse_personal_daemon
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user, throwaway_users


@pytest.fixture(scope="module")
def student() -> Iterator[User]:
    with throwaway_users(1, extra_group=False) as (users, _):
        yield users[0]


class Machine:
    """A server as a user sees it: a system service (a root daemon at the system socket,
    in /tmp so every user can reach it) and the user's own runtime directory."""

    def __init__(self, user: User) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpusched-choice-", dir="/tmp"))
        self.root.chmod(0o755)
        run = self.root / "run"
        run.mkdir(mode=0o755)
        self.system_socket = run / "gpusched.sock"
        self.runtime = self.root / "runtime"
        # Root's, not the user's: the stand-in for their personal daemon runs as root here
        # (it listens where theirs would; a root daemon keeps its socket in root's dirs).
        self.runtime.mkdir(mode=0o755)
        self.personal_socket = self.runtime / "gpusched.sock"
        self.user = user
        self.daemons: list[RunningDaemon] = []

    def daemon(self, name: str, socket: Path) -> RunningDaemon:
        home = self.root / name
        home.mkdir(mode=0o755)
        made = RunningDaemon(home, config={"socket": str(socket)})
        self.daemons.append(made)
        return made

    def env(self) -> dict[str, str]:
        """The user's environment: nothing names a socket or a config."""
        return {
            "XDG_RUNTIME_DIR": str(self.runtime),
            "GPUSCHED_SYSTEM_SOCKET": str(self.system_socket),
        }

    def as_user(self, fn: Any) -> Any:
        def there() -> Any:
            for key in ("GPUSCHED_SOCKET", "GPUSCHED_CONFIG", "XDG_STATE_HOME"):
                os.environ.pop(key, None)
            os.environ.update(self.env())
            return fn()

        return as_user(self.user, there)

    def close(self) -> None:
        for made in self.daemons:
            made.stop()
            made.kill_jobs()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def machine(student: User) -> Iterator[Machine]:
    made = Machine(student)
    yield made
    made.close()


def ping_with_stderr(restart_wait_s: float | None = None) -> dict[str, Any]:
    """Client().ping() as the user, with what the client wrote to stderr meanwhile."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        client = Client()
        if restart_wait_s is not None:
            client.restart_wait_s = restart_wait_s
        try:
            answer = client.ping()
        except DaemonUnreachable as exc:
            return {"error": exc.message, "stderr": said.getvalue()}
    return {"pid": answer["pid"], "stderr": said.getvalue(), "socket": str(client.socket_path)}


def test_the_system_service_is_preferred_over_a_personal_daemon(machine: Machine) -> None:
    system = machine.daemon("system", machine.system_socket).start()
    personal = machine.daemon("personal", machine.personal_socket).start()
    answer = machine.as_user(ping_with_stderr)
    assert answer["socket"] == str(machine.system_socket)
    assert answer["pid"] == system.process.pid != personal.process.pid  # type: ignore[union-attr]


def test_an_explicit_socket_still_reaches_the_personal_daemon(machine: Machine) -> None:
    machine.daemon("system", machine.system_socket).start()
    personal = machine.daemon("personal", machine.personal_socket).start()
    socket = str(machine.personal_socket)
    assert machine.as_user(lambda: Client(socket).ping()["pid"]) == personal.process.pid  # type: ignore[union-attr]

    def through_env() -> int:
        os.environ["GPUSCHED_SOCKET"] = socket
        return int(Client().ping()["pid"])

    assert machine.as_user(through_env) == personal.process.pid  # type: ignore[union-attr]


def test_while_the_service_restarts_the_client_says_so_and_asks_again(machine: Machine) -> None:
    system = machine.daemon("system", machine.system_socket).start()
    system.stop()  # a clean stop removes the socket; /run/gpusched (here run/) stays
    assert not machine.system_socket.exists()
    restarted = threading.Timer(1.0, system.start)
    restarted.start()
    try:
        answer = machine.as_user(lambda: ping_with_stderr(restart_wait_s=30.0))
    finally:
        restarted.join()
    assert answer["pid"] == system.process.pid  # type: ignore[union-attr]
    assert "the system service is not answering" in answer["stderr"]
    assert "it may be restarting; retrying..." in answer["stderr"]


def test_a_stopped_service_is_never_answered_with_start_your_own_daemon(
    machine: Machine,
) -> None:
    system = machine.daemon("system", machine.system_socket).start()
    system.stop()
    answer = machine.as_user(lambda: ping_with_stderr(restart_wait_s=0.5))
    assert "system gpusched service is not answering" in answer["error"]
    assert "Start it with `gpusched daemon`" not in answer["error"]
    assert str(machine.personal_socket) not in answer["error"]


def test_without_a_system_service_the_personal_daemon_is_used(machine: Machine) -> None:
    (machine.root / "run").rmdir()  # nothing installed
    personal = machine.daemon("personal", machine.personal_socket).start()
    answer = machine.as_user(ping_with_stderr)
    assert answer["pid"] == personal.process.pid  # type: ignore[union-attr]


def _daemon_cli(*args: str) -> str:
    """`gpusched daemon ARGS` in this process: its exit code and what it wrote to stderr."""
    from gpusched.cli import cli

    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        try:
            cli.main(["daemon", *args])
        except SystemExit as exc:
            return f"exit {exc.code}: {said.getvalue().strip()}"
    return "started"


def test_a_personal_daemon_refuses_real_gpus_beside_a_system_service(machine: Machine) -> None:
    said = machine.as_user(_daemon_cli)
    assert said.startswith("exit 2: gpusched: a system gpusched service serves this machine")
    assert "--simulate" in said
    # Allowed: simulated GPUs, or a socket of its own (the check only; the daemon itself
    # would run in the foreground here).
    machine.as_user(lambda: refuse_personal_daemon(None, "2x24G", None))
    machine.as_user(lambda: refuse_personal_daemon(None, None, str(machine.root / "mine.sock")))


def test_a_personal_daemon_starts_where_no_system_service_is_installed(
    machine: Machine,
) -> None:
    (machine.root / "run").rmdir()
    machine.as_user(lambda: refuse_personal_daemon(None, None, None))
