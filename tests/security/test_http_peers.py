"""A loopback HTTP client's uid is found without reading a socket table per connection.

Reading /proc/net/tcp* costs a walk of every socket on the machine, in the accept loop:
anyone holding thousands of idle loopback connections (none to gpusched) slowed every
other user's scrape past a second. The daemon asks the kernel for the one client
socket instead (NETLINK_SOCK_DIAG, sock_diag.py; test_sock_diag.py checks its answers).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_harness import RunningDaemon, eventually
from tests.security.attackers import free_port
from tests.users import User, as_user

SCRAPES = 12


def _threads(pid: int) -> list[str]:
    return os.listdir(f"/proc/{pid}/task")


def _traced(pid: int) -> bool:
    for tid in _threads(pid):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        tracer = next(line for line in status.splitlines() if line.startswith("TracerPid:"))
        if tracer.split()[1] == "0":
            return False
    return True


def _scrape(port: int, source: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as c:
        c.settimeout(10)
        c.bind((source, 0))
        c.connect(("127.0.0.1", port))
        c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return data.decode("latin-1").split("\r\n", 1)[0]


def test_the_accept_path_reads_no_socket_table_per_connection(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """strace on every thread of the daemon while two users scrape from loopback
    addresses: it accepts each connection and opens no /proc/net/tcp (test_http_fairness
    shows the uids it finds instead still cap each user)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    mallory, victim = people
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}")
    assert daemon.process is not None
    pid = daemon.process.pid
    with tempfile.NamedTemporaryFile(prefix="gpusched-strace-", suffix=".txt") as out:
        argv = ["strace", "-f", "-qq", "-e", "trace=open,openat,accept,accept4", "-o", out.name]
        tracer = subprocess.Popen([*argv, "-p", str(pid)], stderr=subprocess.PIPE)
        try:
            eventually(lambda: _traced(pid), 20)
            for n in range(SCRAPES):
                user = victim if n % 2 else mallory
                line = as_user(user, functools.partial(_scrape, port, f"127.0.0.{2 + n}"))
                assert line.startswith("HTTP/1.0 200"), (line, daemon.stderr())
        finally:
            tracer.send_signal(signal.SIGINT)  # detaches: the daemon runs on
            tracer.communicate(timeout=30)
        trace = Path(out.name).read_text()
    accepted = [line for line in trace.splitlines() if " accept" in line and "= -1" not in line]
    assert len(accepted) >= SCRAPES, trace[-2000:]  # strace saw the accept loop
    tables = [line for line in trace.splitlines() if "/proc/net/tcp" in line]
    assert tables == [], f"{len(tables)} socket-table opens for {SCRAPES} connections"
    assert daemon.process.poll() is None
