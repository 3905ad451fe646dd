"""Who is at the other end of a TCP connection to the metrics or dashboard port.

A cap per source address is no cap on one local user: every address of 127.0.0.0/8 is
theirs to connect from (one user on 127.0.0.2-.11 held all 32 slots), while everyone
who reaches the dashboard through `ssh -L` comes from 127.0.0.1 and would share one
cap. So a connection from a loopback address is its client socket's owner: the kernel's
socket table (/proc/net/tcp, /proc/net/tcp6) lists each socket with its uid, and the
client's socket is the one whose local end is our peer and whose remote end is us
(sshd's forwarding socket is owned by the user who logged in). A remote client is its
source address. `HttpClient` is the key the listener caps connections by.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

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


def local_peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the client socket of a loopback connection; None if not found."""
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


def http_client(conn: socket.socket, address: str, scraper: str | None) -> HttpClient:
    """The key a connection from `address` is capped by (a local user, or the address)."""
    reserved = scraper is not None and address == scraper
    if is_loopback(address):
        uid = local_peer_uid(conn)
        if uid is not None:
            return HttpClient(uid, None, reserved)
    return HttpClient(None, address, reserved)
