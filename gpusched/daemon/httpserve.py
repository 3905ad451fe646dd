"""A small read-only HTTP server on the daemon's listener machinery (listening.py).

It serves GET (and HEAD) of a fixed table of paths, one request per connection
(HTTP/1.0, `Connection: close`), for the metrics endpoint and the dashboard (either on
its own port, or both on one). Any other method is a 405: nothing here changes anything.
Its bounds are the listener's: connections in all and per client (a local user by the
uid owning its socket, a remote client by its address: tcp_peers.py), one slot kept for
the configured scraper (`metrics_scraper:`), a short deadline (HEAD_DEADLINE_S) for the
whole request head from the connection on (a client trickling it a byte at a time is
dropped), a size cap on that head, and the client request deadline for sending the reply.

A route is a function of the `Request` (its path and query) returning a `Response`; an
error in it is a 500 for that request, logged once a minute at most (with its traceback:
bad input is a 400 from the route, never an error). `host_checked` refuses a Host that
names another site (421: DNS rebinding), on the dashboard's routes and /metrics alike.
Every reply says `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl

from gpusched.core.errors import GpuschedError
from gpusched.daemon.listening import DeadlineReader, Listener, Slots
from gpusched.daemon.tcp_peers import http_client
from gpusched.scheduling.ratelog import RateLimitedLog

log = logging.getLogger("gpusched.http")

MAX_HTTP_CONNECTIONS = 32  # a scraper (or a few people's browsers) needs a handful
MAX_HTTP_CONNECTIONS_PER_ADDRESS = 4  # per local user (uid) or remote address
MAX_HEAD_BYTES = 16 * 1024
# A browser or a scraper sends its whole request head at once; a client that has not in
# this long is stalling (at most the client request deadline, when that is shorter).
HEAD_DEADLINE_S = 5.0

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS |= {421: "Misdirected Request", 431: "Request Header Fields Too Large"}
_REASONS |= {500: "Internal Server Error"}
_REASONS |= {503: "Service Unavailable"}


MAX_QUERY_FIELDS = 8  # the dashboard's requests carry one or two


@dataclass(frozen=True)
class Request:
    path: str
    query: Mapping[str, str] = field(default_factory=dict)  # the last value of each name
    host: str | None = None  # the Host header, as sent (None: none was)


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()  # beyond type, length and nosniff


Route = Callable[[Request], Response]


def text_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, "text/plain; charset=utf-8", (message + "\n").encode(), headers)


def render(response: Response, head_only: bool = False) -> bytes:
    reason = _REASONS.get(response.status, "")
    extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers)
    head = (
        f"HTTP/1.0 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "X-Content-Type-Options: nosniff\r\n"
        f"{extra}"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + response.body


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound and listening on host:port (raises OSError)."""
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class HttpListener(Listener):
    """GET `routes` on a TCP socket; clients are source addresses."""

    name = "http"

    def __init__(
        self,
        sock: socket.socket,
        routes: Mapping[str, Route],
        name: str,
        deadline_s: Callable[[], float],
        scraper: str | None = None,
    ) -> None:
        self.name = name
        self.routes = routes
        self.deadline_s = deadline_s  # read at each connection: a config reload applies
        self.scraper = scraper
        self.errors = RateLimitedLog(log)
        slots = Slots(
            MAX_HTTP_CONNECTIONS, MAX_HTTP_CONNECTIONS_PER_ADDRESS, 1 if scraper is not None else 0
        )
        super().__init__(sock, slots)

    def client_of(self, conn: socket.socket, address: Any) -> Hashable:
        return http_client(conn, str(address[0]), self.scraper)

    def refusal(self, message: str) -> bytes:
        return render(text_response(503, message))

    def serve(self, conn: socket.socket, client: Hashable) -> None:
        deadline_s = self.deadline_s()
        head_s = min(deadline_s, HEAD_DEADLINE_S)
        reader = DeadlineReader(conn, head_s, head_s)
        reader.next_request(pending=True)  # the deadline runs from the connection
        try:
            head = _read_head(reader)
        except (OSError, TimeoutError):
            return  # stalled, trickling or gone: nothing to answer
        head_only = False
        if head is None:
            response = text_response(431, "request head too large")
        else:
            line, host = head
            method, _, rest = line.partition(" ")
            target = rest.partition(" ")[0]
            path, _, query = target.partition("?")
            route = self.routes.get(path)
            head_only = method == "HEAD"
            if method not in ("GET", "HEAD"):
                response = text_response(405, "only GET and HEAD", (("Allow", "GET, HEAD"),))
            elif route is None:
                response = text_response(404, "not found")
            else:
                response = self._answer(route, Request(path, {}, host), query, target)
        conn.settimeout(deadline_s)  # sendall's timeout bounds the whole reply
        try:
            conn.sendall(render(response, head_only))
        except OSError:
            return

    def _answer(self, route: Route, request: Request, query: str, target: str) -> Response:
        try:
            fields = parse_qsl(query, max_num_fields=MAX_QUERY_FIELDS)
        except ValueError:
            return text_response(400, f"at most {MAX_QUERY_FIELDS} query fields")
        try:
            return route(replace(request, query=dict(fields)))
        except Exception as exc:  # one failed page must not end the connection's thread
            # Once a minute per path and error at most: unauthenticated requests in a loop
            # must not fill the journal (a traceback per request would be 48.7 MiB in 20 s).
            self.errors.warning(
                f"{request.path} {type(exc).__name__}",
                f"{self.name}: {request.path} failed: {type(exc).__name__}",
                exc_info=True,
            )
            return text_response(500, "internal error (see the daemon's log)")


class HttpServer:
    """One bound HTTP port and its listener (the daemon runs `serve_forever` in a thread).

    `name` says what it serves ("metrics", "web", or both on one port) in the log and in
    the error for a port that cannot be bound, which names the config keys to change.
    """

    def __init__(self, listener: HttpListener, address: tuple[str, int]) -> None:
        self._listener = listener
        self.address = address
        self.name = listener.name

    @classmethod
    def start(
        cls,
        names: list[str],
        address: tuple[str, int],
        routes: Mapping[str, Route],
        deadline_s: Callable[[], float],
        scraper: str | None = None,
    ) -> HttpServer:
        host, port = address
        name = " and ".join(names)
        try:
            sock = listening_socket(host, port)
        except OSError as exc:
            keys = " and ".join(f"`{each}:`" for each in names)
            raise GpuschedError(
                f"{name}: cannot listen on {host}:{port}: {exc.strerror or exc};"
                f" change {keys} in the config or remove it"
            ) from None
        bound = (host, int(sock.getsockname()[1]))
        log.info("%s on http://%s:%s/", name, *bound)
        return cls(HttpListener(sock, routes, name, deadline_s, scraper), bound)

    def serve_forever(self) -> None:
        self._listener.serve_forever()

    def close(self) -> None:
        self._listener.close()


def _read_head(reader: DeadlineReader) -> tuple[str, str | None] | None:
    """The request line and Host header (None if absent) of a request whose head arrived
    whole; None if it is too large."""
    data = bytearray()
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            return None
        chunk = reader.recv(4096)
        if not chunk:
            raise ConnectionResetError("the client closed before its request ended")
        data.extend(chunk)
    line, *headers = data.decode("latin-1").split("\n")
    host = None
    for header in headers:
        name, sep, value = header.partition(":")
        if sep and name.strip().lower() == "host":
            host = value.strip()
            break
    return line.strip(), host


def host_allowed(host: str | None, own_host: str) -> bool:
    """Whether a Host header names this server: absent (HTTP/1.0), an IP address,
    localhost, or `own_host` (the host written in `web:` or `metrics:`)."""
    if host is None:
        return True
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host  # name:port, or IPv6
    name = name.removeprefix("[").split("]")[0].lower()  # [::1]:8080 -> ::1
    if name in ("localhost", own_host.lower()):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_checked(route: Route, own_host: str) -> Route:
    """`route`, answering 421 to a request whose Host names another site: a page of
    another site, its name pointed at this address (DNS rebinding), cannot read what it
    serves through its visitor's browser or SSH tunnel."""

    def checked(request: Request) -> Response:
        if host_allowed(request.host, own_host):
            return route(request)
        return text_response(
            421,
            f"Host {request.host!r} is not this server: ask for an IP address, localhost or"
            f" {own_host} (a reverse proxy: pass nginx's default Host, $proxy_host)",
        )

    return checked
