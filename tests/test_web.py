"""The dashboard's HTTP side on a real daemon: its JSON against the socket's `status` and
`show`, what a stranger may see, GET only, its headers, and its port.

The pages themselves, in a real browser, are tests/test_web_browser.py.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.client import Client
from gpusched.config.settings import load_config
from gpusched.daemon.httpserve import Response, host_allowed
from gpusched.daemon.web import api
from gpusched.daemon.web.site import RecentReplies
from tests.browser import free_port
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import as_user, throwaway_users

G = 2**30


def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def get_json(port: int, path: str) -> Any:
    status, headers, body = get(port, path)
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    return json.loads(body)


@pytest.fixture(scope="module")
def web_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of one web daemon for the module's tests that read only its pages,
    headers and errors (they submit nothing: nothing of theirs can leak to another)."""
    port = free_port()
    root = tmp_path_factory.mktemp("web")
    daemon = RunningDaemon(root, config={"web": f"127.0.0.1:{port}"})
    try:
        daemon.start()
        yield port
    finally:
        daemon.stop()
        daemon.kill_jobs()


def web_daemon(daemon_factory: Any, **config: Any) -> tuple[RunningDaemon, int]:
    port = free_port()
    return daemon_factory(config={"web": f"127.0.0.1:{port}", **config}).start(), port


def test_api_status_is_the_sockets_status(daemon_factory: Any) -> None:
    daemon, port = web_daemon(daemon_factory)
    ended = daemon.submit("--mem", "1G", "--", "true")
    daemon.wait_state(ended, {"done"})
    first = daemon.submit("--mem", "20G", "--", "sleep", "60")
    second = daemon.submit("--mem", "20G", "--", "sleep", "60")
    waiting = daemon.submit("--mem", "20G", "--", "sleep", "60")
    held = daemon.submit("--mem", "1G", "--hold", "--", "true")
    daemon.wait_reason(waiting, "needs 20.0G")
    eventually(lambda: sum(g["used"] for g in daemon.status()["gpus"]) == 40 * G)

    def same() -> bool:
        web = get_json(port, "/api/status")
        cli = daemon.status("--all")
        by_id = {job["id"]: job for job in cli["jobs"]}
        assert [j["id"] for j in web["running"]] == [first, second]
        assert [j["id"] for j in web["waiting"]] == [waiting, held]
        assert [j["id"] for j in web["ended"]] == [ended]
        assert web["counts"] == {"running": 2, "queued": 1, "held": 1}
        for job in web["waiting"]:
            assert job["waiting_reason"] == by_id[job["id"]]["waiting_reason"]
        return bool(web["gpus"] == cli["gpus"])  # util and memory settle between reads

    eventually(same)


def test_a_visitor_sees_what_another_user_sees(daemon_factory: Any) -> None:
    daemon, port = web_daemon(daemon_factory)
    secret = daemon.submit("--mem", "1G", "--hold", "--name", "mine", "--", "echo", "s3cret")
    job = get_json(port, f"/api/job?id={secret}")["job"]
    assert job["command"] == ["(hidden)"]
    assert job["cwd"] is None
    assert "s3cret" not in json.dumps(get_json(port, "/api/status"))
    # With show_commands, a visitor sees commands as every user does.
    daemon.stop()
    shown, shown_port = web_daemon(daemon_factory, show_commands=True)
    job_id = shown.submit("--mem", "1G", "--hold", "--", "echo", "visible")
    assert get_json(shown_port, f"/api/job?id={job_id}")["job"]["command"] == ["echo", "visible"]


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A daemon directory other users can traverse (pytest's tmp dirs are root-only)."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-web-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_visitor_sees_exactly_a_strangers_status(shared_root: Path) -> None:
    port = free_port()
    daemon = RunningDaemon(shared_root, config={"web": f"127.0.0.1:{port}"}).start()
    try:
        with throwaway_users(1, extra_group=False) as (users, _):
            daemon.submit("--mem", "20G", "--gpus", "2", "--", "sleep", "60")
            ids = [
                daemon.submit("--mem", "1G", "--hold", "--name", "n", "--", "echo", "s3cret"),
                daemon.submit("--mem", "20G", "--", "echo", "s3cret", "too"),
            ]
            daemon.wait_reason(ids[1], "needs 20.0G")
            socket_path = str(daemon.socket_path)
            stranger = as_user(
                users[0],
                lambda: [
                    job
                    for job in Client(socket_path).request("status", all=True)["jobs"]
                    if job["state"] != "running"
                ],
            )
            web = get_json(port, "/api/status")
            assert [j["id"] for j in stranger] == ids
            assert "s3cret" not in json.dumps(web)
            assert web["waiting"] == stranger
            job = get_json(port, f"/api/job?id={ids[0]}")["job"]
            assert job.pop("timeline") == []  # the job page's charts: a held job has none
            assert job.pop("expected_start") is None  # as `show` says; a held job has none
            assert job == stranger[0]
    finally:
        daemon.stop()
        daemon.kill_jobs()


def test_only_get_and_head(web_port: int) -> None:
    port = web_port
    for path in ("/", "/queue", "/api/status", "/api/job?id=1", "/static/dashboard.js"):
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            status, headers, _ = get(port, path, method)
            assert status == 405, (method, path)
            assert headers["Allow"] == "GET, HEAD"
    status, headers, body = get(port, "/api/status", "HEAD")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) > 0


def test_pages_forbid_inline_script_and_foreign_origins(web_port: int) -> None:
    port = web_port
    # /job?id=1 of a daemon without jobs: the page that says so, with the same headers.
    for path, expected in (("/", 200), ("/queue", 200), ("/job?id=1", 404), ("/usage", 200)):
        status, headers, body = get(port, path)
        assert status == expected, path
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["X-Content-Type-Options"] == "nosniff"
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self';" in csp
        assert "default-src 'none'" in csp
        assert "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        html = body.decode()
        assert "<script>" not in html
        assert re.findall(r'(?:src|href)="([^"]*)"', html)  # it does load its files...
        for url in re.findall(r'(?:src|href)="([^"]*)"', html):
            assert url.startswith("/") and not url.startswith("//"), url  # ...only from here
    script = get(port, "/static/dashboard.js")
    assert script[1]["Content-Type"].startswith("text/javascript")
    markup = rb"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function"
    assert not re.search(markup, script[2])  # strings become text nodes, never markup
    assert b"http://" not in script[2].replace(b"http://www.w3.org/2000/svg", b"")


def test_job_api_errors(web_port: int) -> None:
    port = web_port
    status, _, body = get(port, "/api/job?id=999")
    assert (status, json.loads(body)) == (404, {"error": "no job 999"})
    for bad in ("", "?id=", "?id=x", "?id=-1", "?id=1e3", "?id=" + "9" * 40):
        status, _, body = get(port, "/api/job" + bad)
        assert status == 400, bad
        assert "error" in json.loads(body)
    assert get(port, "/nope")[0] == 404
    assert get(port, "/static/../../etc/passwd")[0] == 404


def test_the_page_of_no_job_says_so_and_nothing_else(daemon_factory: Any) -> None:
    daemon, port = web_daemon(daemon_factory)
    job = daemon.submit("--mem", "1G", "--hold", "--", "true")
    status, headers, body = get(port, f"/job?id={job}")
    assert status == 200
    assert b'id="job-facts"' in body
    status, headers, body = get(port, "/job?id=9999")
    assert status == 404
    assert headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")
    page = body.decode()
    assert re.search(r"<h2[^>]*>no job 9999</h2>", page)
    # None of the job page's sections, whose emptiness read as a job with no facts.
    for section in ("job-facts", "memory-chart", "util-chart", "samples", "GPU memory"):
        assert section not in page, section
    # An id that is no number: said as the API says it, escaped.
    status, _, body = get(port, "/job?id=%3Cb%3E")
    assert status == 400
    assert b"expected ?id=JOB (a job number)" in body
    assert b"<b>" not in body


def test_usage_is_fair_shares_memory_time(daemon_factory: Any) -> None:
    daemon, port = web_daemon(daemon_factory)
    job = daemon.submit("--mem", "8G", "--", "sleep", "2")
    daemon.wait_state(job, {"done"}, timeout=30)
    usage = get_json(port, "/api/usage")
    assert usage["half_life_s"] == 3600.0
    assert usage["window_s"] == 36000.0
    [mine] = usage["users"]
    ran = daemon.show(job)
    assert mine["user"] == ran["user"]
    assert mine["share"] == 1.0
    # About 8G held for the job's ~2 s, barely decayed.
    assert 8 * G * 1.5 < mine["usage"] < 8 * G * 5
    assert (mine["running"], mine["queued"], mine["held"]) == (0, 0, 0)


def test_web_and_metrics_share_one_port(daemon_factory: Any) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    daemon_factory(config={"web": address, "metrics": address}).start()
    assert get(port, "/metrics")[2].startswith(b"# HELP")
    assert get(port, "/")[0] == 200


def test_a_busy_web_port_stops_the_daemon_with_a_message(daemon_factory: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        daemon = daemon_factory(config={"web": f"127.0.0.1:{port}"})
        with pytest.raises(RuntimeError, match=f"web: cannot listen on 127.0.0.1:{port}"):
            daemon.start()
    assert not daemon.socket_path.exists()


def test_the_pages_are_package_data() -> None:
    static = resources.files("gpusched.daemon.web") / "static"
    for name in (
        "page.html",
        "server.main.html",
        "queue.main.html",
        "job.main.html",
        "usage.main.html",
        "dashboard.js",
    ):
        assert (static / name).is_file(), name


def test_the_shipped_config_documents_web_off() -> None:
    shipped = Path(__file__).resolve().parents[1] / "config" / "gpusched.yaml"
    assert "web" in yaml.safe_load(shipped.read_text())
    assert load_config(shipped).web_address is None
    assert load_config(None).web_address is None  # off by default


def test_a_reply_is_computed_once_a_second_whoever_asks() -> None:
    now = [100.0]
    recent = RecentReplies(clock=lambda: now[0])
    made: list[int] = []

    def compute() -> Response:
        made.append(1)
        return Response(200, "application/json", str(len(made)).encode())

    assert recent.get("/api/status?", compute).body == b"1"
    now[0] += 0.9
    assert recent.get("/api/status?", compute).body == b"1"  # shared
    assert recent.get("/api/job?7", compute).body == b"2"  # another URL, its own reply
    now[0] += 0.2
    assert recent.get("/api/status?", compute).body == b"3"  # a second later: afresh


def get_with_host(port: int, path: str, host: str | None) -> int:
    """The status of GET path with this Host header (None: none, as HTTP/1.0 allows)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_page_of_another_site_cannot_read_it_by_dns_rebinding(web_port: int) -> None:
    port = web_port
    for path in ("/", "/api/status", "/api/job?id=1", "/static/dashboard.js"):
        assert get_with_host(port, path, f"evil.example:{port}") == 421, path
        assert get_with_host(port, path, "127.0.0.1.evil.example") == 421, path
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "[::1]:80", None):
        assert get_with_host(port, "/api/status", host) == 200, host


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        (None, True),
        ("127.0.0.1:8080", True),
        ("10.1.2.3", True),
        ("[::1]:8080", True),
        ("::1", True),
        ("localhost:8080", True),
        ("gpu-server.lab:8080", True),  # the host written in `web:`
        ("GPU-Server.lab", True),
        ("attacker.example:8080", False),
        ("gpu-server.lab.attacker.example", False),
        ("", False),
    ],
)
def test_host_allowed(host: str | None, allowed: bool) -> None:
    assert host_allowed(host, "gpu-server.lab") is allowed


def test_a_long_queue_is_counted_not_listed(daemon_factory: Any) -> None:
    daemon, port = web_daemon(daemon_factory)
    values = ",".join(str(i) for i in range(api.WAITING_SHOWN + 50))
    sweep = ["--sweep", f"i={values}", "--", "echo", "{i}"]
    result = daemon.cli("submit", "--mem", "1G", "--hold", *sweep)
    assert result.returncode == 0, result.stderr
    web = get_json(port, "/api/status")
    assert len(web["waiting"]) == api.WAITING_SHOWN
    assert web["counts"]["held"] == api.WAITING_SHOWN + 50
    assert [j["id"] for j in web["waiting"]] == sorted(j["id"] for j in web["waiting"])
