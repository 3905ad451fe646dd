"""A loopback HTTP client's uid is found without reading a socket table per connection.

Reading /proc/net/tcp* costs a walk of every socket on the machine, in the accept loop:
anyone holding thousands of idle loopback connections (none to gpusched) slowed every
other user's scrape past a second. The daemon asks the kernel for the one client
socket instead (NETLINK_SOCK_DIAG, sock_diag.py; test_sock_diag.py checks its answers),
and reads the tables only where the kernel does not answer: strace watches the daemon's
calls, and injects the failure of its socket() calls for that case.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually
from tests.security.attackers import _settled_count, attacking, free_port
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


def _strace_while(pid: int, argv: list[str], scrapes: Callable[[Path], None]) -> str:
    """Run `strace -f ARGV -p PID` on every thread of the daemon while scrapes(the
    trace's file) runs; the trace."""
    with tempfile.NamedTemporaryFile(prefix="gpusched-strace-", suffix=".txt") as out:
        command = ["strace", "-f", "-qq", *argv, "-o", out.name, "-p", str(pid)]
        tracer = subprocess.Popen(command, stderr=subprocess.PIPE)
        try:
            eventually(lambda: tracer.poll() is not None or _traced(pid), 20)
            if tracer.poll() is not None:  # no ptrace here (a container without it)
                pytest.skip(f"strace cannot attach: {tracer.communicate()[1].decode()[-300:]}")
            scrapes(Path(out.name))
        finally:
            tracer.send_signal(signal.SIGINT)  # detaches: the daemon runs on
            tracer.communicate(timeout=30)
        return Path(out.name).read_text()


def _scrapes(port: int, users: tuple[User, User], count: int) -> Callable[[Path], None]:
    def scrape_all(_trace: Path) -> None:
        for n in range(count):
            line = as_user(users[n % 2], functools.partial(_scrape, port, f"127.0.0.{2 + n}"))
            assert line.startswith("HTTP/1.0 200"), line

    return scrape_all


def test_the_accept_path_reads_no_socket_table_per_connection(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """strace on every thread of the daemon while two users scrape from loopback
    addresses: it accepts each connection and opens no /proc/net/tcp (test_http_fairness
    shows the uids it finds instead still cap each user)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}")
    assert daemon.process is not None
    argv = ["-e", "trace=open,openat,accept,accept4"]
    trace = _strace_while(daemon.process.pid, argv, _scrapes(port, people, SCRAPES))
    accepted = [line for line in trace.splitlines() if " accept" in line and "= -1" not in line]
    assert len(accepted) >= SCRAPES, trace[-2000:]  # strace saw the accept loop
    tables = [line for line in trace.splitlines() if "/proc/net/tcp" in line]
    assert tables == [], f"{len(tables)} socket-table opens for {SCRAPES} connections"
    assert daemon.process.poll() is None


def test_without_sock_diag_the_tables_are_read_and_that_is_said_once(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Every socket() of the daemon fails (EAFNOSUPPORT, injected by strace) from before
    its first HTTP connection: the uids come from /proc/net/tcp, one user on many
    loopback addresses is still one user, and the log says so once."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    mallory, victim = people
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}")
    assert daemon.process is not None
    argv = ["-e", "trace=socket,open,openat", "-e", "inject=socket:error=EAFNOSUPPORT"]
    trace = _strace_while(daemon.process.pid, argv, _scrapes(port, people, 4))
    assert "AF_NETLINK" in trace, trace[-2000:]
    assert "/proc/net/tcp" in trace
    with attacking(mallory, _hold_from(port, [f"127.0.0.{n}" for n in range(2, 8)])) as report:
        assert report()["held"] <= 4  # a uid's share, found in the table
        assert _scrape(port, "127.0.0.1").startswith("HTTP/1.0 200")
    said = daemon.stderr().count("NETLINK_SOCK_DIAG) do not answer")
    assert said == 1, daemon.stderr()[-3000:]
    assert as_user(victim, functools.partial(_scrape, port, "127.0.0.9")).startswith("HTTP/1.0 200")


def _hold_from(port: int, sources: list[str]) -> Callable[[], dict[str, Any]]:
    """Connect twice from every source address; hold what is not refused."""
    kept: list[socket.socket] = []

    def attack() -> dict[str, Any]:
        for source in sources:
            for _ in range(2):
                conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                conn.settimeout(2)
                conn.bind((source, 0))
                conn.connect(("127.0.0.1", port))
                kept.append(conn)
        return {"held": _settled_count(kept)}

    return attack


def test_a_client_that_resets_first_does_not_turn_the_lookup_off(
    root_daemon: Callable[..., RunningDaemon],
) -> None:
    """The first connection's check asks for our own end of it: a client that resets the
    connection meanwhile (strace holds the daemon's first socket() for a second) takes
    our end out of the kernel's table, which says nothing of the kernel; the next
    connection is checked again, and no table is read."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}")
    assert daemon.process is not None

    def reset_then_scrape(trace: Path) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as conn:
            conn.connect(("127.0.0.1", port))
            eventually(lambda: "socket(AF_NETLINK" in trace.read_text(), 20)  # held there
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # The accept loop takes these once the first connection's check has ended.
        for _ in range(3):
            assert _scrape(port, "127.0.0.3").startswith("HTTP/1.0 200")

    argv = ["-e", "trace=socket,open,openat", "-e", "inject=socket:delay_enter=1000000:when=1"]
    trace = _strace_while(daemon.process.pid, argv, reset_then_scrape)
    assert "(DELAYED)" in trace, trace[-2000:]
    assert "/proc/net/tcp" not in trace, trace[-2000:]
    assert "NETLINK_SOCK_DIAG) do not answer" not in daemon.stderr()
