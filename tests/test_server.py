"""The daemon's front door (gpusched/daemon/server.py) on a real Unix socket, in process.

A real `Server` bound in a temp dir and serving from a thread, over the `Services` of a
real Store and Scheduler on the test doubles of tests/fakes.py (as tests/test_handlers.py
builds them); clients are plain sockets of this process, so the server sees our own uid
through SO_PEERCRED. No daemon process is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.core.requests.protocol import MAX_FRAME_BYTES
from gpusched.daemon import server as server_module
from gpusched.daemon.server import MAX_CONNECTIONS_PER_USER, Server
from tests.daemon_harness import eventually
from tests.fakes import GiB
from tests.test_handlers import Daemon
from tests.world import World, make_world


class Running:
    """A bound Server serving from a thread, and how to talk to it."""

    def __init__(self, world: World, path: Path) -> None:
        self.world = world
        self.daemon = Daemon(world)
        self.server = Server(self.daemon.services, path)
        self.server.bind()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.clients: list[socket.socket] = []

    def connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        conn.connect(str(self.server.socket_path))
        self.clients.append(conn)
        return conn

    def held(self) -> int:
        """Connections the server holds for our uid now."""
        listener = self.server._listener
        assert listener is not None
        return listener.slots.of(f"uid {os.getuid()}")

    def close(self) -> None:
        for conn in self.clients:
            conn.close()
        self.server.close()
        self.thread.join(timeout=5)


def send(conn: socket.socket, line: bytes) -> None:
    conn.sendall(line)


def reply(conn: socket.socket) -> dict[str, Any]:
    """One reply line, parsed (fails on EOF before the newline).

    Read a byte at a time so that a second reply stays in the socket for the next call.
    """
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        assert byte, f"the server closed the connection after {bytes(data)!r}"
        data += byte
    value = json.loads(data)
    assert isinstance(value, dict)
    return value


def ask(conn: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    send(conn, json.dumps(request).encode() + b"\n")
    return reply(conn)


def closed(conn: socket.socket) -> bool:
    """Whether the server has closed this connection (EOF, or reset)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def is_serving(running: Running) -> bool:
    conn = running.connect()
    try:
        answer = ask(conn, {"op": "ping"})
    finally:
        conn.close()
    return answer["ok"] is True and answer["result"]["uid"] == os.getuid()


@pytest.fixture
def running() -> Iterator[Running]:
    # A short directory of our own: a socket's path is limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="gs-srv-") as tmp:
        world = make_world(Path(tmp) / "state", [24 * GiB])
        served = Running(world, Path(tmp) / "gpusched.sock")
        try:
            yield served
        finally:
            served.close()
            world.scheduler.store.close()


def test_a_request_line_gets_one_reply_line_and_the_connection_stays(running: Running) -> None:
    conn = running.connect()
    first = ask(conn, {"op": "ping"})
    assert first["ok"] is True
    assert first["result"]["uid"] == os.getuid()  # who we are, from the kernel
    second = ask(conn, {"op": "status"})  # a second request on the same connection
    assert second == {"ok": True, "result": second["result"]}
    assert second["result"]["jobs"] == []


def test_two_requests_in_one_write_get_two_replies_in_order(running: Running) -> None:
    conn = running.connect()
    send(conn, b'{"op": "ping"}\n{"op": "nope"}\n')
    assert reply(conn)["ok"] is True
    assert reply(conn)["ok"] is False


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"this is not json\n", "frame is not valid UTF-8 JSON"),
        (b"\x00garbage\n", "frame is not valid UTF-8 JSON"),
        (b"\xff\xfe\n", "frame is not valid UTF-8 JSON"),
        (b"[1, 2]\n", "frame must be a JSON object"),
        (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}\n", "nested deeper than"),
    ],
)
def test_a_bad_frame_gets_an_error_reply_and_the_next_line_is_served(
    running: Running, frame: bytes, message: str
) -> None:
    conn = running.connect()
    send(conn, frame)
    answer = reply(conn)
    assert answer["ok"] is False
    assert answer["error"]["kind"] == "protocol"
    assert message in answer["error"]["message"]
    # One line was bad, the stream is still in step: the next request is answered.
    assert ask(conn, {"op": "ping"})["ok"] is True


def test_a_frame_too_large_is_refused_and_only_that_connection_dropped(
    running: Running,
) -> None:
    bystander = running.connect()
    assert ask(bystander, {"op": "ping"})["ok"] is True
    conn = running.connect()
    send(conn, b"x" * (MAX_FRAME_BYTES + 1))  # no newline: the stream is out of step
    answer = reply(conn)
    assert answer["ok"] is False
    assert answer["error"]["kind"] == "protocol"
    assert "frame too large" in answer["error"]["message"]
    assert eventually(lambda: closed(conn), timeout=5)
    assert ask(bystander, {"op": "ping"})["ok"] is True  # another client is unaffected
    assert is_serving(running)


def test_an_unknown_op_is_refused_and_the_connection_kept(running: Running) -> None:
    conn = running.connect()
    for request in ({"op": "format_disk"}, {"op": 3}, {"no_op": True}):
        answer = ask(conn, request)
        assert answer["ok"] is False
        assert answer["error"]["kind"] == "protocol"
        assert "unknown request" in answer["error"]["message"]
    assert ask(conn, {"op": "ping"})["ok"] is True


def test_a_user_past_the_connection_cap_is_refused_with_the_reason(running: Running) -> None:
    held = [running.connect() for _ in range(MAX_CONNECTIONS_PER_USER)]
    eventually(
        lambda: running.held() == MAX_CONNECTIONS_PER_USER,
        timeout=5,
        describe=running.held,
    )
    extra = running.connect()
    answer = reply(extra)
    assert answer["ok"] is False
    assert answer["error"]["message"] == (
        f"too many open connections from uid {os.getuid()} (limit {MAX_CONNECTIONS_PER_USER})"
    )
    assert eventually(lambda: closed(extra), timeout=5)
    # Those held are still served; one closed frees a slot for the next.
    assert ask(held[-1], {"op": "ping"})["ok"] is True
    held[0].close()
    eventually(lambda: running.held() < MAX_CONNECTIONS_PER_USER, timeout=5)
    assert is_serving(running)


def test_a_reply_too_large_becomes_an_error_reply(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(5):
        running.world.submit(8 * GiB)
    conn = running.connect()
    big = ask(conn, {"op": "status"})
    assert big["ok"] is True
    size = len(json.dumps(big))
    # The limit lowered under this status reply (64 MiB for real) rather than 64 MiB sent.
    monkeypatch.setattr(server_module, "MAX_REPLY_BYTES", size // 2)
    answer = ask(conn, {"op": "status"})
    assert answer["ok"] is False
    assert answer["error"]["kind"] == "protocol"
    assert "message too large" in answer["error"]["message"]
    # The connection and the server go on: a small reply still gets through.
    assert ask(conn, {"op": "ping"})["ok"] is True
    assert is_serving(running)


def test_a_client_that_leaves_mid_frame_costs_nothing(running: Running) -> None:
    conn = running.connect()
    send(conn, b'{"op": "pi')
    conn.close()
    eventually(lambda: running.held() == 0, timeout=5, describe=running.held)
    assert is_serving(running)


def test_close_removes_the_socket_and_a_new_server_can_bind(running: Running) -> None:
    path = running.server.socket_path
    running.server.close()
    running.thread.join(timeout=5)
    assert not running.thread.is_alive()
    assert not path.exists()
    again = Running(running.world, path)
    try:
        assert is_serving(again)
    finally:
        again.close()
    with contextlib.suppress(OSError):
        path.unlink()
