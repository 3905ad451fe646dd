"""The wire protocol between client and daemon: newline-delimited JSON over a Unix socket.

A request is one JSON object on one line: {"op": NAME, ...arguments}. A reply is one
JSON object on one line: {"ok": true, "result": ...} or
{"ok": false, "error": {"kind": KIND, "message": ONE_LINE}}. Identity is never part of
a request: the daemon reads it from the socket (SO_PEERCRED).

Both sides import this module; it imports neither side.
"""

from __future__ import annotations

import json
import socket
import struct

from gpusched.core.errors import ERROR_KINDS, GpuschedError, ProtocolError

TYPE_CHECKING = False  # typing's import costs every client command its start-up
if TYPE_CHECKING:
    from typing import Any, Protocol

MAX_FRAME_BYTES = 4 * 2**20  # a submit carries the submitter's environment; 4 MiB is ample
# Replies list jobs: `status` with a 10,000-job sweep queued, or `history --limit 10000`,
# is several MiB. Only clients read replies, and only from their daemon.
MAX_REPLY_BYTES = 64 * 2**20
# What a reply that pages (`status`) holds at most on the wire: a long queue comes in
# pages the client joins, never as one reply of megabytes to build, send and parse.
WIRE_REPLY_BYTES = 2**20
MAX_JSON_DEPTH = 32
# This gpusched's version, pyproject.toml's, published as gpusched.__version__: here, with
# the rule that compares it, so that the client and the daemon import it from the protocol
# they both speak and not from the package root (which imports the client).
VERSION = "0.1.0"
# Every request from this client carries its version; a daemon refuses a client whose
# version is not compatible (VERSIONS_COMPATIBLE). A frame without it (clients before this
# rule) is served.
VERSION_FIELD = "client_version"


def compatible_versions(client: str, daemon: str) -> bool:
    """The rule: a client and a daemon talk when their versions share major and minor
    (0.1.x with 0.1.y; 1.2.x with 1.2.y): requests and replies change only between minor
    versions, and only by adding."""
    return client.split(".")[:2] == daemon.split(".")[:2]


def version_mismatch(client: str, daemon: str) -> str:
    """The one-line refusal, naming both versions and the fix."""
    wanted = ".".join(daemon.split(".")[:2])
    return (
        f"this gpusched client is version {client} but the daemon is {daemon}: they must share"
        f" major.minor ({wanted}); use the server's own `gpusched`, or in your environment"
        " install the wheel its install left (by default: pip install --force-reinstall"
        " --find-links /opt/gpusched/share/wheels /opt/gpusched/share/wheels/gpusched-*.whl)"
    )


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, stopping early past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def encode(message: dict[str, Any], limit: int = MAX_FRAME_BYTES) -> bytes:
    # ASCII escapes, not raw UTF-8: os.environ and sys.argv carry undecodable bytes as lone
    # surrogates (PEP 383), which UTF-8 cannot encode; as \udcXX escapes they reach the
    # daemon unchanged and the job gets back the submitter's exact bytes.
    data = json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"
    if len(data) > limit:
        raise ProtocolError(f"message too large ({len(data)} bytes, limit {limit})")
    return data


def decode(line: bytes, limit: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """Parse one frame (without its newline) into a JSON object, or raise ProtocolError."""
    if len(line) > limit:
        raise ProtocolError(f"frame too large (limit {limit} bytes)")
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("frame is not valid UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError("frame must be a JSON object")
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ProtocolError(f"frame nested deeper than {MAX_JSON_DEPTH} levels")
    return value


if TYPE_CHECKING:

    class Receiver(Protocol):
        """A socket, or anything that reads from one (the daemon's reader adds deadlines)."""

        def recv(self, size: int, /) -> bytes: ...


def read_frame(sock: Receiver, buffer: bytearray, limit: int = MAX_FRAME_BYTES) -> bytes | None:
    """Read one newline-terminated frame; None at a clean end of stream.

    `buffer` carries bytes past the newline between calls on the same connection.
    """
    while True:
        newline = buffer.find(b"\n")
        if newline >= 0:
            frame = bytes(buffer[:newline])
            del buffer[: newline + 1]
            return frame
        if len(buffer) > limit:
            raise ProtocolError(f"frame too large (limit {limit} bytes)")
        chunk = sock.recv(65536)
        if not chunk:
            if buffer:
                raise ProtocolError("connection closed in the middle of a frame")
            return None
        buffer.extend(chunk)


def ok_reply(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def error_reply(error: GpuschedError) -> dict[str, Any]:
    return {"ok": False, "error": {"kind": error.kind, "message": error.message}}


def error_from_reply(reply: dict[str, Any]) -> GpuschedError:
    info = reply.get("error")
    if not isinstance(info, dict):
        return ProtocolError("daemon sent a malformed error reply")
    cls = ERROR_KINDS.get(str(info.get("kind")), GpuschedError)
    return cls(str(info.get("message", "unknown error")))


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
