"""The dashboard's routes: four pages, their static files, and the JSON they poll.

Every file is read from the package once, when the daemon starts, and served from
memory under a fixed path: no path from a request ever reaches the filesystem. Pages
carry a Content-Security-Policy that allows only this origin's script and style sheet
(no inline script, no inline style attribute, nothing from elsewhere) and no framing.

A request whose Host header names neither an IP address, nor localhost, nor the host of
`web:` is refused (421): a page of another site, its name pointed at this address (DNS
rebinding), cannot read the dashboard through its visitor's browser or SSH tunnel.

A JSON reply is computed at most once a second per URL and shared by every viewer
polling it meanwhile, so a room of open tabs costs the daemon one request a second.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable
from importlib import resources
from string import Template
from typing import Any

from gpusched.core.errors import GpuschedError, NotFoundError, UsageError
from gpusched.daemon.httpserve import (
    Request,
    Response,
    Route,
    host_checked,
)
from gpusched.daemon.services import Services
from gpusched.daemon.web import api

# Each page: its name (static/NAME.main.html holds what it shows) and its title. They
# share static/page.html (head, navigation, footer), filled in once at start.
PAGES = {
    "/": ("server", "GPUs"),
    "/queue": ("queue", "Queue"),
    "/job": ("job", "Job"),
    "/usage": ("usage", "Usage"),
}
ASSETS = {
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
    "/favicon.ico": ("icon.svg", "image/svg+xml"),
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
    " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
)
API_HEADERS = (("Content-Security-Policy", "default-src 'none'"), ("Cache-Control", "no-store"))
CACHE_S = 1.0
CACHE_ENTRIES = 256  # distinct URLs kept (job pages); past it the cache starts afresh
MAX_ID_DIGITS = 18  # fits SQLite's integer


def _static(name: str) -> bytes:
    return (resources.files("gpusched.daemon.web") / "static" / name).read_bytes()


def _page(name: str, title: str, main: str | None = None) -> bytes:
    """static/page.html around static/NAME.main.html (or around `main`, markup)."""
    shell = Template(_static("page.html").decode("utf-8"))
    if main is None:
        main = _static(f"{name}.main.html").decode("utf-8").rstrip("\n")
    return shell.substitute(title=title, page=name, main=main).encode("utf-8")


def _job_page(services: Services, page: bytes) -> Route:
    """The job page, if there is such a job; else a page that says so and nothing else
    (404, or 400 for an id that is no number), not the job page's empty sections.
    Its page name, "missing", is one the script polls nothing for."""
    found = Response(200, "text/html; charset=utf-8", page, PAGE_HEADERS)

    def route(request: Request) -> Response:
        try:
            services.store.jobs.get(_job_id(request))
        except (NotFoundError, UsageError) as exc:
            status = 404 if isinstance(exc, NotFoundError) else 400
            said = f'    <h2 id="job-missing">{html.escape(exc.message)}</h2>'
            body = _page("missing", "Job", said)
            return Response(status, "text/html; charset=utf-8", body, PAGE_HEADERS)
        return found

    return route


def _file_route(body: bytes, content_type: str, headers: tuple[tuple[str, str], ...]) -> Route:
    response = Response(200, content_type, body, headers)
    return lambda _request: response


def _json(status: int, value: Any) -> Response:
    body = json.dumps(value, separators=(",", ":")).encode()
    return Response(status, "application/json", body, API_HEADERS)


class RecentReplies:
    """Replies of the last CACHE_S seconds by URL (listener threads share it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.replies: dict[str, tuple[float, Response]] = {}

    def get(self, key: str, compute: Callable[[], Response]) -> Response:
        now = self.clock()
        with self.lock:
            hit = self.replies.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        response = compute()  # outside the lock: a slow reply holds up no other URL
        with self.lock:
            if len(self.replies) >= CACHE_ENTRIES:
                self.replies.clear()
            self.replies[key] = (now, response)
        return response


def _api(compute: Callable[[Request], Any], recent: RecentReplies, reads: tuple[str, ...]) -> Route:
    """`reads`: the query fields the reply depends on, all its cache key holds besides the
    path (47 distinct `/api/status?id=N` a second were 47 computations, not one)."""

    def route(request: Request) -> Response:
        key = request.path + "?" + "&".join(request.query.get(name, "") for name in reads)
        return recent.get(key, lambda: _answer(compute, request))

    return route


def _answer(compute: Callable[[Request], Any], request: Request) -> Response:
    try:
        return _json(200, compute(request))
    except NotFoundError as exc:
        return _json(404, {"error": exc.message})
    except UsageError as exc:
        return _json(400, {"error": exc.message})
    except GpuschedError as exc:
        return _json(500, {"error": exc.message})


def _job_id(request: Request) -> int:
    text = request.query.get("id", "")
    # ASCII only: str.isdigit() is true of "²" and "٣", which int() then refuses (a 500).
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_ID_DIGITS:
        raise UsageError("expected ?id=JOB (a job number)")
    return int(text)


def web_routes(services: Services, own_host: str) -> dict[str, Route]:
    """Every path the dashboard answers (GET and HEAD only: httpserve refuses the rest).
    `own_host`: the host of `web:`, a name requests may use besides addresses."""
    routes: dict[str, Route] = {}
    for path, (name, title) in PAGES.items():
        routes[path] = _file_route(_page(name, title), "text/html; charset=utf-8", PAGE_HEADERS)
    routes["/job"] = _job_page(services, _page(*PAGES["/job"]))
    for path, (name, content_type) in ASSETS.items():
        routes[path] = _file_route(_static(name), content_type, PAGE_HEADERS)
    recent = RecentReplies()
    routes["/api/status"] = _api(lambda _request: api.status(services), recent, ())
    routes["/api/job"] = _api(lambda request: api.job(services, _job_id(request)), recent, ("id",))
    routes["/api/usage"] = _api(lambda _request: api.usage(services), recent, ())
    return {path: host_checked(route, own_host) for path, route in routes.items()}
