"""The client's connection to the daemon: which socket, one request and its reply.

`DaemonConnection.request(op, **args)` opens the Unix socket, sends one newline-delimited
JSON frame (with the client's version: gpusched.core.requests.protocol), reads the reply within
its bounds and turns an error reply into its GpuschedError. The system service's socket
is tried again for a few seconds while it restarts, saying so once on stderr; the error
when nothing answers names the socket(s) tried and what to do. `gpusched.client.Client`
builds every operation on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path

from gpusched.core.errors import DaemonUnreachable, ProtocolError
from gpusched.core.requests.protocol import (
    MAX_REPLY_BYTES,
    VERSION,
    VERSION_FIELD,
    decode,
    encode,
    error_from_reply,
    read_frame,
)
from gpusched.daemon_socket import choose_socket

TYPE_CHECKING = False  # typing's import costs every client command its start-up
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 120.0
# The system service is asked again for this long when its socket is missing or refuses
# (systemd restarts it within RestartSec=2s plus its start-up).
RESTART_WAIT_S = 10.0
RESTART_RETRY_INTERVAL_S = 0.25


class DaemonConnection:
    """How to reach one daemon (gpusched.daemon_socket chooses the socket); each
    request opens and closes the socket."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        choice = choose_socket(socket_path, config_path)
        self.socket_path: Path = choice.path
        self._tried = choice.tried
        self.system_service = choice.system
        self._connect_timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
        self._reply_timeout_s = REPLY_TIMEOUT_S if timeout_s is None else timeout_s
        self.restart_wait_s = RESTART_WAIT_S
        self._said_restarting = False

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise the daemon's error as a GpuschedError."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._connect_timeout_s)
            self._connect(sock)
            sock.settimeout(self._reply_timeout_s)
            # A daemon that refuses a connection (too many, out of files) says why and
            # closes at once: its reason is still there to read after a broken pipe.
            with contextlib.suppress(BrokenPipeError):
                sock.sendall(encode({"op": op, VERSION_FIELD: VERSION, **args}))
            frame = read_frame(sock, bytearray(), limit=MAX_REPLY_BYTES)
        except (TimeoutError, ConnectionResetError, BrokenPipeError) as exc:
            raise DaemonUnreachable(
                f"the gpusched daemon at {self.socket_path} stopped answering ({exc})"
            ) from None
        finally:
            sock.close()
        if frame is None:
            raise DaemonUnreachable(
                f"the gpusched daemon at {self.socket_path} closed the connection"
            )
        reply = decode(frame, limit=MAX_REPLY_BYTES)
        if reply.get("ok") is True:
            return reply.get("result")
        if reply.get("ok") is False:
            raise error_from_reply(reply)
        raise ProtocolError("the daemon sent a reply without 'ok'")

    def _connect(self, sock: socket.socket) -> None:
        """Connect; the system service's socket is tried again for `restart_wait_s`, since
        a service that is restarting answers again within seconds."""
        deadline = time.monotonic() + (self.restart_wait_s if self.system_service else 0.0)
        while True:
            try:
                sock.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() >= deadline:
                    raise DaemonUnreachable(self._unreachable(exc)) from None
                if not self._said_restarting:
                    self._said_restarting = True
                    print(
                        f"gpusched: the system service is not answering at {self.socket_path}:"
                        " it may be restarting; retrying...",
                        file=sys.stderr,
                        flush=True,
                    )
                time.sleep(RESTART_RETRY_INTERVAL_S)
            except PermissionError:
                raise DaemonUnreachable(
                    f"cannot reach the gpusched daemon at {self.socket_path}: permission denied"
                ) from None
            else:
                return

    def _unreachable(self, exc: OSError) -> str:
        if self.system_service:
            return (
                f"the system gpusched service is not answering at {self.socket_path}"
                f" ({exc.strerror}), not even after {self.restart_wait_s:g}s: it is stopped or"
                " failing; ask your administrator (systemctl status gpusched). Do not start"
                " a personal `gpusched daemon`: the server's limits would not apply to it"
            )
        tried = " or ".join(str(p) for p in self._tried)
        return (
            f"cannot reach the gpusched daemon at {tried} ({exc.strerror}):"
            " is it running? Start it with `gpusched daemon`, or point --socket at it"
        )
