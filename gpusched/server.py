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
import threading
from pathlib import Path
from typing import Any

from gpusched.errors import GpuschedError, PermissionDenied, ProtocolError
from gpusched.handlers import HANDLERS
from gpusched.identity import Caller, user_name
from gpusched.models import Job
from gpusched.protocol import (
    MAX_REPLY_BYTES,
    decode,
    encode,
    error_reply,
    ok_reply,
    peer_credentials,
    read_frame,
)
from gpusched.scheduler import Scheduler

log = logging.getLogger("gpusched.server")

MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_USER = 64
IDLE_TIMEOUT_S = 60.0
HIDDEN_COMMAND = ["(hidden)"]
# Ends whose detail is gpusched's own words about public facts (a signal's name, who
# cancelled, which dependency failed, the memory over the declared): shown to everyone.
PUBLIC_DETAILS = frozenset({"signal", "cancelled", "dependency_failed", "overrun", "timeout"})


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
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._per_uid: dict[int, int] = {}
        self._per_uid_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopping = False

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
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        # Everyone may connect on a shared server: identity comes from SO_PEERCRED.
        os.chmod(path, 0o600 if self.single_user else 0o666)
        listener.listen(128)
        self._listener = listener

    def serve_forever(self) -> None:
        listener = self._listener
        if listener is None:
            raise RuntimeError("serve_forever() before bind()")
        while not self._stopping:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._stopping:
                    return
                raise
            if not self._slots.acquire(blocking=False):
                conn.close()  # too many clients at once: drop, never queue unboundedly
                continue
            try:
                uid = peer_credentials(conn)[1]
            except OSError:
                conn.close()
                self._slots.release()
                continue
            # One user's idle or stalled connections must not use up everybody's slots.
            with self._per_uid_lock:
                if self._per_uid.get(uid, 0) >= MAX_CONNECTIONS_PER_USER:
                    refused = True
                else:
                    refused = False
                    self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            if refused:
                message = f"too many open connections from uid {uid}"
                with contextlib.suppress(OSError):
                    conn.sendall(encode(error_reply(GpuschedError(message))))
                conn.close()
                self._slots.release()
                continue
            threading.Thread(target=self._serve, args=(conn, uid), daemon=True).start()

    def close(self) -> None:
        self._stopping = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- one connection -------------------------------------------------------------------------

    def _serve(self, conn: socket.socket, uid: int) -> None:
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            caller = self._identify(conn)
            buffer = bytearray()
            while True:
                try:
                    frame = read_frame(conn, buffer)
                except ProtocolError as exc:
                    conn.sendall(encode(error_reply(exc)))
                    return  # the stream is out of step: drop this connection only
                if frame is None:
                    return
                reply = self.handle_frame(caller, frame)
                try:
                    data = encode(reply, limit=MAX_REPLY_BYTES)
                except ProtocolError as exc:  # an answer no client would read: say so
                    data = encode(error_reply(exc))
                conn.sendall(data)
        except (OSError, TimeoutError):
            return  # the client went away or stalled: nothing to answer
        except Exception:
            log.exception("unexpected error serving a client")
        finally:
            conn.close()
            with self._per_uid_lock:
                self._per_uid[uid] -= 1
            self._slots.release()

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
