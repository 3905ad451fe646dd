"""The daemon's front door: a Unix socket, one request per line, identity from the kernel.

Each connection gets a thread; each request is decoded, authenticated by the
socket's peer credentials (SO_PEERCRED: never a field the client sends, never
$USER), authorized, and dispatched through a flat table of handlers (handlers.py). A
handler returns a value; the server writes it. Any error in a request becomes an error
reply; nothing a client sends can stop the server.

This module owns the socket, the connections and their limits, and the authorization
rules the handlers call (`owned_job`, `visible`); who a uid is lives in identity.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from gpusched.core.errors import GpuschedError, PermissionDenied, ProtocolError
from gpusched.core.models import Job
from gpusched.core.protocol import (
    MAX_REPLY_BYTES,
    decode,
    encode,
    error_reply,
    ok_reply,
    peer_credentials,
    read_frame,
)
from gpusched.daemon.handlers import HANDLERS
from gpusched.daemon.identity import Caller, user_name
from gpusched.daemon.listening import DeadlineReader, Listener, Slots
from gpusched.scheduling.scheduler import Scheduler

log = logging.getLogger("gpusched.server")

MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_USER = 64
HIDDEN_COMMAND = ["(hidden)"]
# Ends whose detail is gpusched's own words about public facts (a signal's name, who
# cancelled, which dependency failed, the memory over the declared): shown to everyone.
PUBLIC_DETAILS = frozenset({"signal", "cancelled", "dependency_failed", "overrun", "timeout"})


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
    def __init__(
        self, scheduler: Scheduler, socket_path: Path, owner_uid: int | None = None
    ) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.config = scheduler.config
        self.socket_path = socket_path
        # Run by root: serve everyone, each as themselves. Run by a user: serve only that user.
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.single_user = self.owner_uid != 0
        self._listener: _SocketListener | None = None

    # -- listening ----------------------------------------------------------------------------

    def bind(self) -> None:
        path = self.socket_path
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            if not self.single_user:
                # A directory we made for the socket must let every user reach it.
                os.chmod(path.parent, 0o755)  # noqa: S103
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # a stale socket from a daemon that died
            else:
                probe.close()
                raise GpuschedError(f"another gpusched daemon is already listening on {path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        # Everyone may connect on a shared server: identity comes from SO_PEERCRED.
        os.chmod(path, 0o600 if self.single_user else 0o666)
        sock.listen(128)
        self._listener = _SocketListener(sock, self)

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
            idle_s = self.config.client_idle_timeout_s
            reader = DeadlineReader(conn, idle_s, self.config.client_request_timeout_s)
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
        admin = uid in (0, self.owner_uid) or user in self.config.admins
        return Caller(pid, uid, gid, user, admin)

    def handle_frame(self, caller: Caller, frame: bytes) -> dict[str, Any]:
        try:
            request = decode(frame)
            op = request.get("op")
            handler = HANDLERS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise ProtocolError(f"unknown request {op!r}")
            if self.single_user and caller.uid != self.owner_uid:
                raise PermissionDenied(
                    f"this gpusched daemon runs as {user_name(self.owner_uid)} and serves only"
                    " that user; start your own with `gpusched daemon`, or use the system service"
                )
            return ok_reply(handler(self, caller, request))
        except GpuschedError as exc:
            return error_reply(exc)
        except Exception as exc:  # a bug must cost one request, not the daemon
            log.exception("request failed")
            return error_reply(GpuschedError(f"internal error: {type(exc).__name__}: {exc}"))

    # -- authorization ---------------------------------------------------------------------------

    def owned_job(self, caller: Caller, job_id: int) -> Job:
        job = self.store.get(job_id)
        if job.uid != caller.uid and not caller.admin:
            raise PermissionDenied(
                f"job {job_id} belongs to {job.user}: you can act only on your own jobs"
            )
        return job

    def visible(self, caller: Caller, job: Job) -> dict[str, Any]:
        job = self.scheduler.decorate(job)
        data = job.to_json()
        if job.uid != caller.uid and not caller.admin and not self.config.show_commands:
            data["command"] = HIDDEN_COMMAND
            data["cwd"] = None
            data["notify"] = None if job.notify is None else HIDDEN_COMMAND
            if job.array_id is not None:
                # A swept job's name ends with its sweep values ("lr=0.1 token=..."): as
                # private as the command they were put into. Only the name as a whole is
                # stored, so the whole name is hidden (the user, array and index still show).
                data["name"] = None
            if job.reason not in PUBLIC_DETAILS:
                # A failed start names the program and the working directory; an OOM quotes
                # a line of the job's output.
                data["reason_detail"] = None
        return data
