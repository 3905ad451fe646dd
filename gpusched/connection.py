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
# A follower (`wait`, `logs -f`) rides out a daemon that is away for this long, whichever
# daemon it is: a restart on a loaded machine takes seconds, and the job goes on meanwhile.
FOLLOW_WAIT_S = 30.0


class _Away(Exception):
    """The daemon is not there (no socket, refused) or left in the middle of a request
    (`sent`): what a restart looks like from the client."""

    def __init__(self, message: str, sent: bool, strerror: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sent = sent
        self.strerror = strerror


class DaemonConnection:
    """How to reach one daemon (gpusched.daemon_socket chooses the socket); each
    request opens and closes the socket.

    `follow_s`: how long a request that may safely be sent again (a follower's: `wait`,
    `logs -f`) keeps trying while the daemon is away, also when it left in the middle of
    the request; 0 by default, when only the system service's connect is tried again.
    """

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
        self._source = choice.source
        self.system_service = choice.system
        self._connect_timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
        self._reply_timeout_s = REPLY_TIMEOUT_S if timeout_s is None else timeout_s
        self.restart_wait_s = RESTART_WAIT_S
        self.follow_s = 0.0
        self._said_restarting = False

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise the daemon's error as a GpuschedError.

        While the daemon is away it is asked again, every RESTART_RETRY_INTERVAL_S: for
        `restart_wait_s` when the system service's socket does not connect, for
        `follow_s` whatever the daemon and however it went away."""
        away_since: float | None = None  # from the first failure: a long `wait` is no loss
        while True:
            try:
                return self._request_once(op, args)
            except _Away as away:
                away_since = time.monotonic() if away_since is None else away_since
                bound = self.follow_s
                if self.system_service and not away.sent:
                    bound = max(bound, self.restart_wait_s)
                if time.monotonic() - away_since >= bound:
                    raise DaemonUnreachable(self._unreachable(away, bound)) from None
                self._say_retrying(bound)
                time.sleep(RESTART_RETRY_INTERVAL_S)

    def _request_once(self, op: str, args: dict[str, Any]) -> Any:
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
        except TimeoutError as exc:
            raise DaemonUnreachable(
                f"the gpusched daemon at {self.socket_path} stopped answering ({exc})"
            ) from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Away(
                f"the gpusched daemon at {self.socket_path} stopped answering ({exc})", sent=True
            ) from None
        finally:
            sock.close()
        if frame is None:
            raise _Away(f"the gpusched daemon at {self.socket_path} closed the connection", True)
        reply = decode(frame, limit=MAX_REPLY_BYTES)
        if reply.get("ok") is True:
            return reply.get("result")
        if reply.get("ok") is False:
            raise error_from_reply(reply)
        raise ProtocolError("the daemon sent a reply without 'ok'")

    def _connect(self, sock: socket.socket) -> None:
        try:
            sock.connect(str(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise _Away(str(exc), sent=False, strerror=exc.strerror) from None
        except PermissionError:
            raise DaemonUnreachable(
                f"cannot reach the gpusched daemon at {self.socket_path}: permission denied"
            ) from None

    def _say_retrying(self, bound: float) -> None:
        """Once per connection, on stderr: the command is not stuck, it waits for a restart."""
        if self._said_restarting:
            return
        self._said_restarting = True
        who = "the system service" if self.system_service else "the gpusched daemon"
        print(
            f"gpusched: {who} is not answering at {self.socket_path}: it may be"
            f" restarting; retrying... (for up to {bound:g}s)",
            file=sys.stderr,
            flush=True,
        )

    def _unreachable(self, away: _Away, waited: float) -> str:
        after = f", not even after {waited:g}s" if waited > 0 else ""
        if away.sent:
            return f"{away.message}{after}"
        if self.system_service:
            return (
                f"the system gpusched service is not answering at {self.socket_path}"
                f" ({away.strerror}){after}: it is stopped or failing; ask your"
                " administrator (systemctl status gpusched). Do not start a personal"
                " `gpusched daemon`: the server's limits would not apply to it"
            )
        tried = " or ".join(str(p) for p in self._tried)
        return f"cannot reach the gpusched daemon at {tried} ({away.strerror}){after}: " + (
            _ADVICE.get(self._source, _ADVICE["personal"])
        )


# What to do when no daemon answers, by what chose the socket.
_ADVICE = {
    "option": "is a daemon listening there? Start one with `gpusched --socket PATH daemon"
    " --detach`, or give --socket the path it listens on",
    "env": "is a daemon listening there? $GPUSCHED_SOCKET names it: start one with"
    " `gpusched daemon --detach` (which listens there too), or unset GPUSCHED_SOCKET to"
    " reach the default daemon",
    "config": "is a daemon listening there? The config file's `socket:` names it: start"
    " that daemon (`gpusched --config FILE daemon --detach`), or point --socket at another",
    "personal": "is it running? Start it with `gpusched daemon --detach`, or point --socket at it",
}
