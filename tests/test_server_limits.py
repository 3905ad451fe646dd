"""One user's idle connections cannot lock the daemon's socket for everybody."""

from __future__ import annotations

import json
import socket

from gpusched.daemon.server import MAX_CONNECTIONS_PER_USER
from tests.daemon_harness import RunningDaemon, answers, eventually


def test_idle_connections_are_capped_per_user_and_freed_on_close(daemon: RunningDaemon) -> None:
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS_PER_USER):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(daemon.socket_path))
            idle.append(conn)
        # Every idle connection is served (a ping on the first answers)...
        idle[0].sendall(b'{"op": "ping"}\n')
        assert json.loads(idle[0].recv(65536))["ok"] is True
        # ...and one more from the same uid is told why it is refused.
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(str(daemon.socket_path))
        extra.settimeout(10)
        reply = json.loads(extra.recv(65536))
        extra.close()
        assert reply["ok"] is False
        assert "too many open connections" in reply["error"]["message"]
    finally:
        for conn in idle:
            conn.close()
    # The server notices the closed connections as their threads read EOF: shortly after.
    eventually(lambda: answers(daemon))
