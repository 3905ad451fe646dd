"""Who is at the other end of a TCP connection to the metrics or dashboard port.

A cap per source address is no cap on one local user: every address of 127.0.0.0/8 is
theirs to connect from (one user on 127.0.0.2-.11 held all 32 slots), while everyone
who reaches the dashboard through `ssh -L` comes from 127.0.0.1 and would share one
cap. So a connection from a loopback address is its client socket's owner: the socket
whose local end is our peer and whose remote end is us (sshd's forwarding socket is
owned by the user who logged in). A remote client is its source address. `HttpClient`
is the key the listener caps connections by.

The kernel is asked for that one socket by its exact tuple (NETLINK_SOCK_DIAG,
sock_diag.py), a hash lookup: the socket tables (/proc/net/tcp, /proc/net/tcp6) list
each socket with its uid too, but reading them walks every socket on the machine, in
the accept loop, and anyone can hold thousands (with 8,000 idle loopback connections
open, a /metrics scrape took over a second). The tables are read only where the kernel
does not answer the query, which is said once in the log. Whether it answers is checked
on the first connection, against our own end of it (its inode is the accepted socket's),
so a kernel that answers wrongly is not trusted either.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from gpusched.daemon.sock_diag import Endpoint, socket_owner

log = logging.getLogger("gpusched.http")

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class HttpClient:
    """A local user (`uid`) or a remote address; `reserved`: the configured scraper."""

    uid: int | None
    address: str | None
    reserved: bool = False

    def __str__(self) -> str:
        return f"uid {self.uid}" if self.uid is not None else str(self.address)


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


def _hex_endpoint(address: str, port: int) -> tuple[str, ...]:
    """The ways /proc/net/tcp* writes this endpoint (each 32-bit word in host order)."""
    ip = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    forms = []
    mapped = getattr(ip, "ipv4_mapped", None)
    for each in {ip, mapped} - {None}:
        packed = each.packed  # type: ignore[union-attr]
        words = struct.unpack(f"={len(packed) // 4}I", packed)
        forms.append("".join(f"{w:08X}" for w in words) + f":{port:04X}")
    if isinstance(ip, ipaddress.IPv4Address):  # as an IPv6 socket sees it
        words = struct.unpack("=4I", ipaddress.IPv6Address(f"::ffff:{ip}").packed)
        forms.append("".join(f"{w:08X}" for w in words) + f":{port:04X}")
    return tuple(forms)


def table_peer_uid(conn: socket.socket) -> int | None:
    """The client socket's uid as /proc/net/tcp* lists it (a read of every socket)."""
    peer_host, peer_port = conn.getpeername()[:2]
    our_host, our_port = conn.getsockname()[:2]
    theirs = set(_hex_endpoint(peer_host, peer_port))
    ours = set(_hex_endpoint(our_host, our_port))
    for table in _TABLES:
        try:
            with table.open() as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) > 7 and fields[1] in theirs and fields[2] in ours:
                        return int(fields[7])
        except OSError:
            continue
    return None


# Errors that say nothing of whether the kernel answers sock_diag queries: this
# connection's client is not found, and the next connection checks again.
_PASSING = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EINTR})


class _Netlink:
    """Whether NETLINK_SOCK_DIAG answers here: unknown (None) until a connection shows it."""

    def __init__(self) -> None:
        self.works: bool | None = None
        self.lock = threading.Lock()

    def check(self, conn: socket.socket, ours: Endpoint, peer: Endpoint) -> bool | None:
        """Ask for our own end of `conn`, whose inode we know; None: could not tell."""
        with self.lock:
            if self.works is not None:
                return self.works
            try:
                own = socket_owner(ours, peer)
                why = "no answer for a socket of ours" if own is None else "a wrong answer"
                right = own is not None and own.inode == os.fstat(conn.fileno()).st_ino
                if not right:
                    # A client that reset the connection leaves our end out of the
                    # kernel's table: that shows nothing of the kernel (and must not
                    # let anyone turn the lookup off for good).
                    conn.getpeername()
                self.works = right
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, TimeoutError) or exc.errno in _PASSING | {errno.ENOTCONN}:
                    return None
                why = str(exc)
                self.works = False
            if not self.works:
                log.warning(
                    "http: the kernel's socket diagnostics (NETLINK_SOCK_DIAG) do not answer"
                    " (%s): each loopback client's uid is found in /proc/net/tcp, a read of"
                    " every socket on the machine per connection",
                    why,
                )
            return self.works


_netlink = _Netlink()


def local_peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the client socket of a loopback connection; None if not found."""
    peer = Endpoint.of(conn.getpeername())
    ours = Endpoint.of(conn.getsockname())
    works = _netlink.check(conn, ours, peer)
    if works is None:
        return None
    if not works:
        return table_peer_uid(conn)
    try:
        owner = socket_owner(peer, ours)
    except (OSError, TimeoutError):
        return None
    return None if owner is None else owner.uid


def http_client(conn: socket.socket, address: str, scraper: str | None) -> HttpClient:
    """The key a connection from `address` is capped by (a local user, or the address)."""
    reserved = scraper is not None and address == scraper
    if is_loopback(address):
        uid = local_peer_uid(conn)
        if uid is not None:
            return HttpClient(uid, None, reserved)
    return HttpClient(None, address, reserved)
