"""The HTTP listeners are fair per user, not per address (issue 27, items 4, 5, 14, 16).

Before: the cap of 4 connections was per source address, so mallory on 127.0.0.2-.11
held all 32 slots (every dashboard request and scrape got 503), while two users behind
`ssh -L` (both from 127.0.0.1) shared one cap; `GET /api/job?id=%C2%B2` was a 500 with a
1.9 KB traceback in the log per request; /metrics answered any Host (DNS rebinding);
the dashboard's cache was keyed on `?id=` for every path.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from gpusched.daemon.httpserve import Request, Response
from gpusched.daemon.listening import Slots
from gpusched.daemon.tcp_peers import HttpClient
from gpusched.daemon.web.site import RecentReplies, _api
from tests.daemon_harness import RunningDaemon
from tests.security.attackers import _settled_count, attacking, free_port
from tests.users import User, as_user


def _hold_from(port: int, sources: list[str], each: int) -> Callable[[], dict[str, Any]]:
    """Connect `each` times from every source address and hold what is not refused."""
    kept: list[socket.socket] = []

    def attack() -> dict[str, Any]:
        for source in sources:
            for _ in range(each):
                conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                conn.settimeout(2)
                conn.bind((source, 0))
                conn.connect(("127.0.0.1", port))
                kept.append(conn)
        held = _settled_count(kept)
        return {"opened": len(kept), "held": held}

    return attack


def _get(port: int, path: str, host: str | None = None, source: str = "127.0.0.1") -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.bind((source, 0))
        conn.connect(("127.0.0.1", port))
        head = f"GET {path} HTTP/1.0\r\n" + (f"Host: {host}\r\n" if host else "") + "\r\n"
        conn.sendall(head.encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        return data


def _get_as(user: User, port: int, path: str) -> str:
    return str(as_user(user, lambda: _get(port, path).decode("latin-1")))


def test_one_local_user_on_many_loopback_addresses_gets_one_users_share(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}", web=f"127.0.0.1:{port}")
    sources = [f"127.0.0.{n}" for n in range(2, 12)]
    with attacking(mallory, _hold_from(port, sources, 4)) as report:
        seen = report()
        assert seen["opened"] == 40
        assert seen["held"] <= 4, seen  # a uid's share, whatever its addresses
        assert _get_as(victim, port, "/metrics").startswith("HTTP/1.0 200"), daemon.stderr()
        assert _get_as(victim, port, "/api/status").startswith("HTTP/1.0 200")


def test_users_behind_the_same_tunnel_address_are_not_lumped_together(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """`ssh -L` makes every user's connection come from 127.0.0.1 (sshd's socket is the
    user's): mallory's share does not take the victim's."""
    mallory, victim = people
    port = free_port()
    root_daemon(web=f"127.0.0.1:{port}")
    with attacking(mallory, _hold_from(port, ["127.0.0.1"], 8)) as report:
        assert report()["held"] <= 4
        assert _get_as(victim, port, "/api/status").startswith("HTTP/1.0 200")


def test_a_unicode_digit_id_is_a_400_and_bad_input_logs_no_traceback(
    root_daemon: Callable[..., RunningDaemon],
) -> None:
    port = free_port()
    daemon = root_daemon(web=f"127.0.0.1:{port}")
    for _ in range(50):
        reply = _get(port, "/api/job?id=%C2%B2")
        assert reply.startswith(b"HTTP/1.0 400"), reply[:200]
    for bad in ("%D9%A3", "1%00", "-1", "1e3", "%EF%BC%91"):  # Arabic 3, NUL, fullwidth 1
        assert _get(port, f"/api/job?id={bad}").startswith(b"HTTP/1.0 400")
    assert "Traceback" not in daemon.stderr()


def test_metrics_refuses_a_host_that_names_another_site(
    root_daemon: Callable[..., RunningDaemon],
) -> None:
    port = free_port()
    root_daemon(metrics=f"127.0.0.1:{port}")
    assert _get(port, "/metrics", host="attacker.example").startswith(b"HTTP/1.0 421")
    assert _get(port, "/metrics", host=f"127.0.0.1:{port}").startswith(b"HTTP/1.0 200")
    assert _get(port, "/metrics", host="localhost").startswith(b"HTTP/1.0 200")


def test_the_dashboard_cache_keys_only_on_what_a_path_reads() -> None:
    """/api/status reads no query: 47 distinct ?id=N a second are one computation."""
    computed: list[str] = []

    def status(request: Request) -> Any:
        computed.append(request.path)
        return {"ok": True}

    recent = RecentReplies(clock=lambda: 0.0)
    status_route = _api(status, recent, ())
    job_route = _api(status, recent, ("id",))
    for n in range(47):
        reply: Response = status_route(Request("/api/status", {"id": str(n)}))
        assert reply.status == 200
    assert computed == ["/api/status"]
    for n in range(3):
        job_route(Request("/api/job", {"id": str(n)}))
    assert computed.count("/api/job") == 3


def test_the_scrapers_reserved_slot_is_its_own() -> None:
    slots = Slots(total=3, per_client=4, reserve=1)
    users = [HttpClient(uid, None) for uid in (1001, 1002, 1003)]
    assert slots.take(users[0]) is None and slots.take(users[1]) is None
    assert slots.take(users[2]) is not None  # the last slot is the scraper's
    assert slots.take(HttpClient(None, "10.0.0.5", reserved=True)) is None
