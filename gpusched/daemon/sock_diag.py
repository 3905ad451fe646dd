"""Asking the kernel who owns one TCP socket: a NETLINK_SOCK_DIAG query by its 4-tuple.

A `SOCK_DIAG_BY_FAMILY` request without `NLM_F_DUMP` names one socket by its exact
tuple (`inet_diag_req_v2`'s `id`), and the kernel finds it by the same hash lookup that
delivers its packets: the answer costs the same with ten sockets on the machine or
ten thousand, where reading /proc/net/tcp walks every one of them.

The answer (`inet_diag_msg`) is trusted only if it came from the kernel (the query's
socket is connected to port id 0, so no process can send to it) and names the tuple
asked for. Stdlib only: `struct` lays out the kernel's structures (linux/inet_diag.h,
linux/netlink.h), in host byte order except ports and addresses.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
import struct
from dataclasses import dataclass
from typing import Any

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
ALL_STATES = 0xFFFFFFFF
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE, in each of the cookie's two words

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, extensions, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # ports and addresses: network byte order
_SOCKID_REST = struct.Struct("=III")  # interface, cookie
_MESSAGE = struct.Struct("=BBBB")  # family, state, timer, retransmits
_MESSAGE_REST = struct.Struct("=IIIII")  # expires, receive queue, send queue, uid, inode
_ERROR = struct.Struct("=i")
_ANSWER_SIZE = 8192  # one inet_diag_msg and a few attributes, or an error and our request

_sequence = itertools.count(1)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Endpoint:
    """One end of a TCP connection, an IPv4-mapped IPv6 address as the IPv4 address."""

    address: IPAddress
    port: int

    @classmethod
    def of(cls, sockaddr: Any) -> Endpoint:
        """From getsockname()/getpeername(): (host, port) or (host, port, flow, scope)."""
        host, port = str(sockaddr[0]), int(sockaddr[1])
        return cls(_unmapped(ipaddress.ip_address(host.split("%", maxsplit=1)[0])), port)


@dataclass(frozen=True)
class Owner:
    uid: int
    inode: int


def _unmapped(ip: IPAddress) -> IPAddress:
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _family(ip: IPAddress) -> int:
    return socket.AF_INET if ip.version == 4 else socket.AF_INET6


def request(local: Endpoint, remote: Endpoint, sequence: int) -> bytes:
    """The netlink message asking for the TCP socket whose own end is `local` and whose
    other end is `remote` (the kernel reads `id`'s src as the socket's local end)."""
    body = _REQUEST.pack(_family(local.address), socket.IPPROTO_TCP, 0, 0, ALL_STATES)
    body += _SOCKID.pack(local.port, remote.port, local.address.packed, remote.address.packed)
    body += _SOCKID_REST.pack(0, NO_COOKIE, NO_COOKIE)
    header = _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, sequence, 0)
    return header + body


def parse_answer(data: bytes, local: Endpoint, remote: Endpoint, sequence: int) -> Owner | None:
    """The owner in the kernel's answer to `request(local, remote, sequence)`; None if the
    kernel has no such socket or the answer is for another. Raises OSError for the
    kernel's other errors."""
    if len(data) < _HEADER.size:
        return None
    length, kind, _flags, seq, _port = _HEADER.unpack_from(data)
    if seq != sequence or length > len(data):
        return None
    if kind == NLMSG_ERROR:
        (error,) = _ERROR.unpack_from(data, _HEADER.size)
        if error == -errno.ENOENT:
            return None
        raise OSError(-error, f"sock_diag: {errno.errorcode.get(-error, -error)}")
    offset = _HEADER.size
    if kind != SOCK_DIAG_BY_FAMILY or length < offset + _MESSAGE.size + _SOCKID.size + 32:
        return None
    family = _MESSAGE.unpack_from(data, offset)[0]
    offset += _MESSAGE.size
    sport, dport, src, dst = _SOCKID.unpack_from(data, offset)
    offset += _SOCKID.size + _SOCKID_REST.size
    uid, inode = _MESSAGE_REST.unpack_from(data, offset)[3:5]
    width = 4 if family == socket.AF_INET else 16
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    ours = (
        Endpoint(_unmapped(ipaddress.ip_address(src[:width])), sport),
        Endpoint(_unmapped(ipaddress.ip_address(dst[:width])), dport),
    )
    return Owner(uid, inode) if ours == (local, remote) else None


def socket_owner(local: Endpoint, remote: Endpoint, timeout_s: float = 1.0) -> Owner | None:
    """Who owns the TCP socket whose own end is `local` and other end `remote`; None if
    the kernel has none. Raises OSError when the kernel cannot be asked."""
    if local.address.version != remote.address.version:
        return None
    sequence = next(_sequence) & 0xFFFFFFFF
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(timeout_s)
        sock.connect((0, 0))  # the kernel: no process can send to a connected socket
        sock.send(request(local, remote, sequence))
        while True:
            data, (port_id, _groups) = sock.recvfrom(_ANSWER_SIZE)
            if port_id != 0:
                continue
            header_seq = _HEADER.unpack_from(data)[3] if len(data) >= _HEADER.size else None
            if header_seq == sequence:
                return parse_answer(data, local, remote, sequence)
