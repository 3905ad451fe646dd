"""The daemon's front door: a Unix socket, one request per line, identity from the kernel.

Each connection gets a thread; each request is decoded, authenticated by the
socket's peer credentials (SO_PEERCRED: never a field the client sends, never
$USER), and handed to `handlers.dispatch` with the daemon's `Services`. A handler
returns a value; the server writes it. Any error in a request becomes an error reply;
nothing a client sends can stop the server.

This module owns the socket, the connections, the framing and their limits, nothing
else: the handlers never see the server; who a uid is lives in identity.py, what a
caller may do or see in auth.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from gpusched.core.errors import GpuschedError, ProtocolError
from gpusched.core.requests.protocol import (
    MAX_REPLY_BYTES,
    decode,
    encode,
    error_reply,
    ok_reply,
    peer_credentials,
    read_frame,
)
from gpusched.daemon.auth import is_admin
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller, user_name
from gpusched.daemon.listening import DeadlineReader, Listener, Slots
from gpusched.daemon.services import Services
from gpusched.daemon.trusted_dirs import untrusted_part
from gpusched.store.engine import (
    busy,
    commits_sent,
    is_disconnect,
    is_disk_full,
    is_pool_exhausted,
    unavailable,
)

log = logging.getLogger("gpusched.server")

MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_USER = 64


class _SocketListener(Listener):
    """The Unix socket's accept loop: clients are uids (SO_PEERCRED)."""

    name = "socket"

    def __init__(self, sock: socket.socket, server: Server) -> None:
        self.server = server
        super().__init__(sock, Slots(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_USER))

    def client_of(self, conn: socket.socket, address: Any) -> Hashable:
        return f"uid {peer_credentials(conn)[1]}"

    def serve(self, conn: socket.socket, client: Hashable) -> None:
        self.server._serve(conn)

    def refusal(self, message: str) -> bytes:
        return encode(error_reply(GpuschedError(message)))


class Server:
    def __init__(self, services: Services, socket_path: Path) -> None:
        # The services' owner_uid: run by root, serve everyone, each as themselves; run
        # by a user, serve only that user (auth.check_served).
        self.services = services
        self.socket_path = socket_path
        self.single_user = services.single_user
        self._listener: _SocketListener | None = None

    # -- listening ----------------------------------------------------------------------------

    def bind(self) -> None:
        path = self.socket_path
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            if not self.single_user:
                # A directory we made for the socket must let every user reach it.
                os.chmod(path.parent, 0o755)  # noqa: S103
        if not self.single_user:
            # Checked at start-up (main.py) and again now: a directory that did not exist
            # then (in a shared temp directory) may have been made by a user since, who
            # could then swap in a socket of their own and read others' submits.
            why = untrusted_part(path.parent)
            if why is not None:
                raise GpuschedError(
                    f"socket {path}: another user could replace it: {why}; choose a"
                    " `socket:` under a directory only root can change"
                )
        if self.refuse_if_answered():
            path.unlink()  # a stale socket from a daemon that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        # Everyone may connect on a shared server: identity comes from SO_PEERCRED.
        os.chmod(path, 0o600 if self.single_user else 0o666)
        sock.listen(128)
        self._listener = _SocketListener(sock, self)

    def refuse_if_answered(self) -> bool:
        """Raise GpuschedError if another daemon answers on the socket, else say whether
        something that does not answer (a stale socket) is at its path. Asked before a
        start touches anything a live daemon owns (its zygote, its running jobs), and
        again when binding."""
        path = self.socket_path
        if not (path.exists() or path.is_symlink()):
            return False
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            return True
        finally:
            probe.close()
        raise GpuschedError(f"another gpusched daemon is already listening on {path}")

    def serve_forever(self) -> None:
        """Accept until close(); raises only if the listening socket itself breaks."""
        if self._listener is None:
            raise RuntimeError("serve_forever() before bind()")
        self._listener.serve_forever()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- one connection -------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        """Answer requests until the client closes, stalls, or trickles (the caller closes)."""
        try:
            caller = self._identify(conn)
            # Idle: between requests, and the most a reply may take to be read. Request:
            # a submit is at most 4 MiB, well under a second over a Unix socket.
            config = self.services.config  # read per connection: a reload reaches the next
            idle_s = config.client_idle_timeout_s
            reader = DeadlineReader(conn, idle_s, config.client_request_timeout_s)
            buffer = bytearray()
            while True:
                reader.next_request(pending=bool(buffer))
                try:
                    frame = read_frame(reader, buffer)
                except ProtocolError as exc:
                    conn.settimeout(idle_s)
                    conn.sendall(encode(error_reply(exc)))
                    return  # the stream is out of step: drop this connection only
                if frame is None:
                    return
                reply = self.handle_frame(caller, frame)
                try:
                    data = encode(reply, limit=MAX_REPLY_BYTES)
                except ProtocolError as exc:  # an answer no client would read: say so
                    data = encode(error_reply(exc))
                # sendall's timeout bounds the whole reply: a client that does not read
                # cannot hold its slot (and the reply's memory) forever.
                conn.settimeout(idle_s)
                conn.sendall(data)
        except (OSError, TimeoutError):
            return  # the client went away, stalled or trickled: nothing to answer

    def _identify(self, conn: socket.socket) -> Caller:
        pid, uid, gid = peer_credentials(conn)
        user = user_name(uid)
        admin = is_admin(uid, user, self.services.owner_uid, self.services.config)
        return Caller(pid, uid, gid, user, admin)

    def handle_frame(self, caller: Caller, frame: bytes) -> dict[str, Any]:
        commits = commits_sent()
        try:
            return ok_reply(dispatch(self.services, caller, decode(frame)))
        except GpuschedError as exc:
            return error_reply(exc)
        except Exception as exc:  # a bug must cost one request, not the daemon
            if is_disconnect(exc):  # the database is away: say which, not a traceback
                if is_disk_full(exc):  # give back the room kept for this, now
                    self.services.store.check_space()
                sent = commits_sent() != commits  # a COMMIT went out: it may have applied
                error = unavailable(exc, self.services.store.where, committed=sent)
                log.warning("request refused: %s", error.message)
                return error_reply(error)
            if is_pool_exhausted(exc):  # raised at a checkout: nothing was sent
                error = busy(self.services.store.where)
                log.warning("request refused: %s", error.message)
                return error_reply(error)
            log.exception("request failed")
            return error_reply(GpuschedError(f"internal error: {type(exc).__name__}: {exc}"))
