"""The kernel's answer to a NETLINK_SOCK_DIAG query is the client socket's, and its owner.

The uid found for a loopback HTTP client is the client's (a real user's), never that of
our own end of the connection (root's), for IPv4, IPv6 and IPv4 on a dual-stack
listener; a tuple that names no socket is no answer; the /proc/net/tcp fallback agrees.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from gpusched.daemon.sock_diag import Endpoint, socket_owner
from gpusched.daemon.tcp_peers import local_peer_uid, table_peer_uid
from tests.security.attackers import attacking
from tests.users import User

# Where each client connects from and to: (its address, the listener's address).
ROUTES = (("127.0.0.7", "127.0.0.1"), ("::1", "::1"), ("127.0.0.9", "::"))


def _listen(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if host == "::":
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, 0))
    sock.listen(8)
    return sock


def _connect_to(ports: list[int]) -> Callable[[], dict[str, Any]]:
    kept: list[socket.socket] = []  # held until the attacker is let go

    def attack() -> dict[str, Any]:
        seen = []
        for (source, listener), port in zip(ROUTES, ports, strict=True):
            conn = socket.socket(socket.AF_INET6 if ":" in source else socket.AF_INET)
            conn.bind((source, 0))
            conn.connect(("127.0.0.1" if listener == "::" else listener, port))
            seen.append({"port": conn.getsockname()[1], "inode": os.fstat(conn.fileno()).st_ino})
            kept.append(conn)
        return {"seen": seen}

    return attack


def test_the_uid_is_the_client_sockets_owner_for_each_family(
    people: tuple[User, User],
) -> None:
    mallory, _ = people
    listeners = [_listen(listener) for _, listener in ROUTES]
    try:
        ports = [sock.getsockname()[1] for sock in listeners]
        with attacking(mallory, _connect_to(ports)) as report:
            seen = report()["seen"]
            for sock, theirs in zip(listeners, seen, strict=True):
                conn, _ = sock.accept()
                with conn:
                    peer = Endpoint.of(conn.getpeername())
                    ours = Endpoint.of(conn.getsockname())
                    assert peer.port == theirs["port"]
                    owner = socket_owner(peer, ours)
                    assert owner is not None
                    assert (owner.uid, owner.inode) == (mallory.uid, theirs["inode"])
                    own = socket_owner(ours, peer)  # the other end: ours, root's
                    assert own is not None
                    assert own.inode == os.fstat(conn.fileno()).st_ino
                    assert local_peer_uid(conn) == mallory.uid
                    assert table_peer_uid(conn) == mallory.uid  # the fallback agrees
                    assert socket_owner(Endpoint(peer.address, ours.port), ours) is None
    finally:
        for sock in listeners:
            sock.close()
