"""Protocol fuzzing against a real daemon's socket (issue 5).

Whatever a client sends costs that client an error reply, or at worst its own
connection: never the daemon, never another client, never an "internal error" (which
would mean a handler let an exception escape), never a traceback in the daemon's log.

The daemon under fuzz has one GPU, held by a whole-GPU "blocker" job, so any job a
fuzzed submit happens to create only queues (it is cancelled at once): random argv
never runs. The blocker is never cancelled or waited on by the fuzz.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.client import Client
from gpusched.core.requests.catalog import REQUESTS
from gpusched.core.requests.protocol import MAX_FRAME_BYTES
from tests.daemon_harness import RunningDaemon

pytestmark = pytest.mark.fuzz  # skipped locally with -m "not fuzz"; CI runs it

OPS = sorted(REQUESTS)
NOWHERE = "/nonexistent/gpusched-fuzz"
MIN_FRAMES = 10_000


# The fields each request may carry, read from its dataclass (gpusched.core.requests.catalog): a
# new request or field is fuzzed as soon as it is declared there.
FIELDS = {
    op: frozenset(each.name for each in dataclasses.fields(kind))  # type: ignore[arg-type]
    for op, kind in REQUESTS.items()
}
ALL_FIELDS = sorted(set().union(*FIELDS.values()))


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


JUNK: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    10**400,
    0.5,
    -1.5,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "x",
    "/",
    "\ud800",
    "a\udcff",
    "\x00",
    "a" * 5000,
    [],
    [None],
    [True],
    [-1],
    [2**64],
    ["x"],
    ["\ud800"],
    [["x", ["y"]]],
    [["x", ["\udcff"]]],
    [[]],
    {},
    {"a": "b"},
    {"a": 1},
    {"\ud800": "x"},
    _nested(20),
]


# -- a raw connection: frames out, reply lines in -------------------------------------------


class Conn:
    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buffer.extend(chunk)
        end = self.buffer.index(b"\n")
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return line

    def exchange(self, frames: list[bytes]) -> list[bytes]:
        """Send every frame (pipelined, from a thread) and read one reply line per frame."""
        for frame in frames:
            assert b"\n" not in frame
        errors: list[BaseException] = []

        def write() -> None:
            try:
                self.sock.sendall(b"".join(frame + b"\n" for frame in frames))
            except OSError as exc:
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        replies: list[bytes] = []
        for _ in frames:
            line = self.line()
            assert line is not None, f"connection closed after {len(replies)} replies"
            replies.append(line)
        writer.join()
        assert not errors, errors
        return replies


def check_reply(frame: bytes, line: bytes) -> dict[str, Any]:
    """Every reply: a JSON object, ok true/false; an error has a kind and a one-line message."""
    reply = json.loads(line)
    context = (frame[:200], line[:300])
    assert isinstance(reply, dict), context
    assert reply.get("ok") in (True, False), context
    if reply["ok"] is False:
        error = reply.get("error")
        assert isinstance(error, dict), context
        assert isinstance(error.get("kind"), str) and error["kind"], context
        message = error.get("message")
        assert isinstance(message, str) and message.strip(), context
        assert "\n" not in message, context
        assert not message.startswith("internal error"), context
    else:
        assert "result" in reply, context
    return reply


def _encode(request: Any) -> bytes:
    # allow_nan: NaN and Infinity are not JSON, but Python's decoder (the daemon's) takes them.
    return json.dumps(request, separators=(",", ":")).encode()


def _is_int(value: Any, wanted: int) -> bool:
    return type(value) is int and value == wanted


def _created_jobs(request: Any, reply: dict[str, Any]) -> list[int]:
    """Ids of jobs a fuzzed request created (a submit, requeue or run that was accepted).

    A `run` job is this process's own interactive job: left queued, any `wait` on it would
    block for the daemon's whole 30 s."""
    if not reply["ok"] or not isinstance(request, dict):
        return []
    if request.get("op") not in ("submit", "requeue", "run"):
        return []
    result = reply["result"]
    items = result if isinstance(result, list) else [result]
    return [item["id"] for item in items if isinstance(item, dict) and "id" in item]


# -- the daemon under fuzz -------------------------------------------------------------------


class Target:
    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.path = str(daemon.socket_path)
        client = daemon.client()
        # Holds the only GPU for the whole fuzz, so nothing a fuzzed submit creates runs.
        self.blocker = client.submit(["sleep", "600"], cwd="/", env={})
        daemon.wait_state(self.blocker.id, {"running"})
        # An ended job that never ran: a harmless target for id-taking requests.
        ended = client.submit([NOWHERE], cwd="/", env={}, hold=True)
        client.cancel(ended.id)
        self.ended = ended.id
        self.created: list[int] = []

    def base(self, op: str) -> dict[str, Any]:
        """A well-formed request for `op`, so that a junk field is actually reached."""
        valid: dict[str, Any] = {
            "id": self.blocker.id if op in ("logs", "show") else self.ended,
            "ids": [self.ended],
            "command": [NOWHERE, "{x}"],  # a sweep over x can fill it
            "cwd": "/",
            "env": {"PATH": "/usr/bin:/bin"},
            "mem": 2**30,
            "gpus": 1,
            "umask": 0o022,
            "name": "fuzz",
            "time": 60,
            "priority": 0,
            "after": [],
            "hold": True,
            "offset": 0,
            "max_bytes": 100,
            "all": False,
            "limit": 5,
            "user": "root",
            "timeout": 0,
        }
        request = {"op": op}
        request.update({f: valid[f] for f in FIELDS[op] if f in valid})
        return request

    def cancel_created(self, conn: Conn) -> None:
        if self.created:
            frames = [_encode({"op": "cancel", "id": job_id}) for job_id in self.created]
            conn.exchange(frames)  # some may have been cancelled already: conflict is fine
            self.created.clear()

    def harmless(self, request: Any) -> Any:
        """Keep the fuzz off the blocker: cancelling it would let fuzzed jobs run, waiting
        on it would block for up to 30 s. (`cancel` with `mine` cancels all of root's jobs,
        the blocker among them.)"""
        if isinstance(request, dict):
            blocker = self.blocker.id
            if _is_int(request.get("id"), blocker) and request.get("op") == "cancel":
                request["id"] = blocker + 10**6
            if request.get("op") == "cancel" and request.get("mine") is True:
                request["mine"] = False
            if request.get("op") == "placement":
                # The fuzz's own `run` jobs are this process's: waiting for one to be
                # placed would block for 30 s, as `wait` on the blocker would.
                request["timeout"] = 0
            ids = request.get("ids")
            if isinstance(ids, list) and request.get("op") == "wait":
                request["ids"] = [self.ended if _is_int(i, blocker) else i for i in ids]
        return request

    def finish(self) -> None:
        """After the abuse: alive, answering, a clean log, and a normal job still runs."""
        daemon = self.daemon
        assert daemon.process is not None and daemon.process.poll() is None, daemon.stderr()
        client = daemon.client()
        assert client.ping()["pid"] == daemon.process.pid
        client.undrain()  # the fuzz may have drained the daemon (it is root)
        for job in client.status().jobs:
            if job.id != self.blocker.id:
                client.cancel(job.id)
        client.cancel(self.blocker.id)
        job = client.submit(
            [sys.executable, "-c", "print('still scheduling')"], mem="1G", cwd="/", env={}
        )
        ended = client.wait(job.id, timeout=30)
        assert (ended.state, ended.exit_code) == ("done", 0), ended
        assert client.logs(job.id).data == b"still scheduling\n"
        log_text = daemon.stderr()
        for sign in ("Traceback", "request failed", "unexpected error serving"):
            assert sign not in log_text, log_text[log_text.index(sign) - 200 :][:4000]


@pytest.fixture
def target(daemon_factory: Any) -> Target:
    # max_job_bytes raised: test_replies_bigger_than_a_request_still_reach_the_client
    # needs jobs whose commands are larger than a request may be.
    settings = {"poll_interval": "0.5s", "max_job_bytes": "4M"}
    daemon = daemon_factory(simulate="1x24G", config=settings).start()
    return Target(daemon)


class Pinger:
    """Another client, pinging all along: the abuse must never shut it out."""

    def __init__(self, path: str) -> None:
        self.client = Client(path)
        self.stop = threading.Event()
        self.count = 0
        self.slowest_s = 0.0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self.run, name="pinger")

    def run(self) -> None:
        while not self.stop.wait(0.02):
            began = time.monotonic()
            try:
                self.client.ping()
            except Exception as exc:
                self.failures.append(repr(exc))
            self.slowest_s = max(self.slowest_s, time.monotonic() - began)
            self.count += 1

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()


# -- frame generators -----------------------------------------------------------------------


def random_bytes(rng: random.Random, n: int) -> Iterator[bytes]:
    for _ in range(n):
        yield rng.randbytes(rng.randrange(0, 200)).replace(b"\n", b" ")


def truncated(rng: random.Random, requests: list[dict[str, Any]], n: int) -> Iterator[bytes]:
    for _ in range(n):
        whole = _encode(rng.choice(requests))
        yield whole[: rng.randrange(0, len(whole))]


def unknown_ops(rng: random.Random, n: int) -> Iterator[bytes]:
    odd: list[Any] = [None, 1, 1.5, True, [], {}, "", "PING", " ping", "ping\x00", "\ud800"]
    for i in range(n):
        op = rng.choice(odd) if i % 2 else "".join(rng.choices("abcdefgh_-", k=rng.randrange(9)))
        if isinstance(op, str) and op in REQUESTS:
            op = op + "?"
        request: dict[str, Any] = {"op": op, "id": rng.randrange(-5, 5)}
        if i % 7 == 0:
            del request["op"]
        yield _encode(request)


def deep_frames() -> Iterator[bytes]:
    for depth in (31, 32, 33, 40, 100, 1000, 10_000, 100_000):
        yield b'{"op":"ping","x":' + b"[" * depth + b"]" * depth + b"}"
        yield b'{"op":"show","id":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
        yield b"[" * depth + b"]" * depth
        yield b"[" * depth  # and never closed
        yield b'{"a":' * depth
    for _ in range(30):
        yield b'{"op":"ping","x":' + b"[" * 200_000 + b"}"


def odd_documents() -> Iterator[bytes]:
    docs = [b"", b" ", b"\t", b"\r", b"null", b"[]", b"1", b'"ping"', b"true", b"NaN", b"{}"]
    docs += [b'{"op":"show","id":' + b"9" * 5000 + b"}", b'{"op":"ping"}' * 3]
    docs += [b'{"op":"ping","op":"nope"}', b'\xef\xbb\xbf{"op":"ping"}', b'{"op":"\\ud800"}']
    docs += ['{"op":"ping","é":"ü"}'.encode("utf-16"), b'{"op":"ping"}\x00', b"\xff\xfe"]
    for _ in range(5):
        yield from docs


def wrong_types(target: Target) -> Iterator[tuple[dict[str, Any], bytes]]:
    """Every field of every op, set to every junk value: alone and in a valid request."""
    for op in OPS:
        for field in sorted(FIELDS[op]) or ["id"]:
            for junk in JUNK:
                for shape in ({**target.base(op), field: junk}, {"op": op, field: junk}):
                    request = target.harmless(shape)
                    yield request, _encode(request)


# -- the tests -------------------------------------------------------------------------------


def test_junk_frames_cost_one_reply_and_never_the_daemon(target: Target) -> None:
    rng = random.Random(5)
    path = target.path
    answered = 0  # frames whose reply was read and checked
    idle = [Conn(path) for _ in range(8)]  # connect and say nothing, all along
    with Pinger(path) as pinger:
        # Requests that are well-formed JSON objects: many per connection.
        conn = Conn(path)
        batch: list[tuple[Any, bytes]] = list(wrong_types(target))
        requests = [target.base(op) for op in OPS]
        batch += [(None, f) for f in truncated(rng, requests, 2500)]
        batch += [(None, f) for f in unknown_ops(rng, 1500)]
        batch += [(None, f) for f in odd_documents()]
        for start in range(0, len(batch), 500):
            chunk = batch[start : start + 500]
            answers = conn.exchange([frame for _, frame in chunk])
            for (request, frame), line in zip(chunk, answers, strict=True):
                reply = check_reply(frame, line)
                target.created += _created_jobs(request, reply)
            target.cancel_created(conn)
            answered += len(chunk)
        # Random bytes, deep nesting: still one error reply each, on one connection.
        for frames in (list(random_bytes(rng, 3500)), list(deep_frames())):
            for start in range(0, len(frames), 500):
                raw = frames[start : start + 500]
                for frame, line in zip(raw, conn.exchange(raw), strict=True):
                    assert check_reply(frame, line)["ok"] is False or frame.startswith(b"{")
                answered += len(raw)
        conn.close()

        answered += _oversized_frames(path)
        halves = _half_frames_then_close(path)
        unread = _never_reads_its_replies(path)
        # The idle clients were never dropped for someone else's junk, and still answer.
        for quiet in idle:
            assert check_reply(b"ping", quiet.exchange([b'{"op":"ping"}'])[0])["ok"]
            quiet.close()
    assert pinger.count > 20 and not pinger.failures, pinger.failures[:5]
    assert pinger.slowest_s < 10, pinger.slowest_s
    print(
        f"\nfuzz: {answered} frames answered and checked, {halves} half frames then hang-up,"
        f" {unread} requests never read, {len(idle)} idle clients; {pinger.count} pings from"
        f" another client meanwhile (slowest {pinger.slowest_s * 1000:.0f} ms)"
    )
    assert answered >= MIN_FRAMES
    target.finish()


def _oversized_frames(path: str) -> int:
    """Over 4 MiB: one protocol error naming the limit, then that connection is dropped."""
    frames = [
        b"a" * (MAX_FRAME_BYTES + 1),
        b'{"op":"ping","pad":"' + b"x" * (MAX_FRAME_BYTES + 10) + b'"}',
        b'{"op":"submit","command":["' + b"y" * (2 * MAX_FRAME_BYTES) + b'"]}',
    ]
    for frame in frames:
        conn = Conn(path)
        # Earlier frames on the same connection are answered first.
        writer = threading.Thread(
            target=lambda c=conn, f=frame: _quietly(c.sock.sendall, b'{"op":"ping"}\n' + f + b"\n")
        )
        writer.start()
        assert check_reply(b"ping", conn.line() or b"")["ok"] is True
        reply = check_reply(frame[:100], conn.line() or b"")
        assert reply["error"]["kind"] == "protocol" and "too large" in reply["error"]["message"]
        if len(frame) > MAX_FRAME_BYTES + 65536:
            # No newline within reach: the daemon stops reading and hangs up. (With the
            # newline in the last chunk read, the frame is refused whole and the stream
            # stays in step: either is fine.)
            with contextlib.suppress(ConnectionResetError):  # it hung up on unread data
                assert conn.line() is None
        writer.join()
        conn.close()
    # Just under the limit is still a frame.
    conn = Conn(path)
    pad = MAX_FRAME_BYTES - 64
    big = b'{"op":"ping","pad":"' + b"z" * pad + b'"}'
    assert check_reply(b"big ping", conn.exchange([big])[0])["ok"] is True
    conn.close()
    return 2 * len(frames) + 1


def _quietly(send: Callable[[bytes], None], data: bytes) -> None:
    with contextlib.suppress(OSError):  # the daemon may hang up before reading it all
        send(data)


def _half_frames_then_close(path: str) -> int:
    """Half a request, then hang up (and hang up at once, and shut down writing only)."""
    count = 0
    for i in range(60):
        conn = Conn(path)
        conn.sock.sendall(b'{"op":"submit","command":["true"],"cwd":"/"'[: i % 40])
        if i % 3 == 0:
            conn.sock.shutdown(socket.SHUT_WR)  # a clean end of stream mid-frame
            line = conn.line()
            if i % 40:
                reply = check_reply(b"half", line or b"")
                assert reply["error"]["kind"] == "protocol"
            else:
                assert line is None
        conn.close()
        count += 1
    return count


def _never_reads_its_replies(path: str) -> int:
    """Requests whose replies are never read: that client's thread blocks, nobody else's."""
    conn = Conn(path, timeout=2.0)
    frame = _encode({"op": "status", "all": True}) + b"\n"
    sent = 0
    with contextlib.suppress(TimeoutError):
        for _ in range(20_000):
            conn.sock.sendall(frame)
            sent += 1
    # The pinger keeps running meanwhile; a fresh client too.
    assert Client(path).ping()
    conn.close()
    return sent


# -- hypothesis: request shapes ------------------------------------------------------------

json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
_small_ints = st.integers(-2, 40)
_words = st.text(max_size=8)
# Values of the right type (mostly in range), so that requests get past the checks too.
_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "id": _small_ints,
    "ids": st.lists(_small_ints, min_size=1, max_size=4),
    "after": st.lists(_small_ints, max_size=3),
    "array": st.integers(-2, 5),
    "command": st.lists(_words, min_size=1, max_size=3).map(lambda a: [NOWHERE, "{x}", *a]),
    "cwd": st.sampled_from(["/", "/tmp", "relative", "/nonexistent", ""]),
    "env": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    "mem": st.integers(-1, 2**40),
    "gpus": st.integers(-1, 3),
    "umask": st.integers(-1, 0o1000),
    "name": _words,
    "time": st.floats(-1, 1e10),
    "priority": st.integers(-(2**63), 2**63 - 1),
    "hold": st.booleans(),
    "max_concurrent": st.integers(-1, 3),
    "notify": st.lists(_words, max_size=3),
    "sweep": st.lists(st.tuples(st.sampled_from(["x", "y", "1"]), st.lists(_words, max_size=3))),
    "offset": st.integers(-5, 2**63 - 1),
    "max_bytes": st.integers(-5, 2**40),
    "all": st.booleans(),
    "limit": st.integers(-1, 20),
    "user": st.sampled_from(["root", "nobody", ""]) | _words,
    "timeout": st.floats(min_value=-1, max_value=0.05) | st.just(float("nan")),
}


def _of_type(kind: type, name: str) -> st.SearchStrategy[Any]:
    """Wire values of a field's declared type, for a field _PLAUSIBLE does not know yet."""
    return _wire(get_type_hints(kind)[name])


def _wire(hint: Any) -> st.SearchStrategy[Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return st.none() | _wire(next(a for a in args if a is not type(None)))
    if origin is tuple:
        if args[-1] is Ellipsis:
            return st.lists(_wire(args[0]), max_size=3)
        return st.tuples(*map(_wire, args)).map(list)
    if origin is not None:  # a Mapping
        return st.dictionaries(_wire(args[0]), _wire(args[1]), max_size=3)
    scalars: dict[Any, st.SearchStrategy[Any]] = {
        bool: st.booleans(),
        int: st.integers(-2, 2**63 - 1),
        float: st.floats(-1, 1e10),
        str: _words,
    }
    return scalars[hint]


# Present in every plausible request that reads them: without them nothing gets far.
_KEY_FIELDS = {"command", "cwd", "id", "ids", "array"}


def _shaped(op: Any) -> st.SearchStrategy[dict[str, Any]]:
    """The fields `op` reads, each absent or plausible, then up to two set to any JSON."""
    own = sorted(FIELDS.get(op, set())) if isinstance(op, str) else []
    plausible = {f: _PLAUSIBLE[f] if f in _PLAUSIBLE else _of_type(REQUESTS[op], f) for f in own}
    keys = st.sampled_from(own or ALL_FIELDS) | st.sampled_from(ALL_FIELDS) | st.text(max_size=6)
    required = {f: v for f, v in plausible.items() if f in _KEY_FIELDS and op != "cancel"}
    optional = {f: v for f, v in plausible.items() if f not in required}
    return st.builds(
        lambda fields, junk: {**fields, **junk, **({} if op is None else {"op": op})},
        st.fixed_dictionaries(required, optional=optional),
        st.just({}) | st.just({}) | st.dictionaries(keys, json_values, min_size=1, max_size=2),
    )


# Nine requests in ten name a real op; the rest a junk one (or none).
_ops = st.integers(0, 9).flatmap(
    lambda i: st.sampled_from(OPS) if i else st.one_of(st.text(max_size=8), json_leaves)
)
requests = _ops.flatmap(_shaped)


def test_any_request_shape_gets_a_well_formed_reply(target: Target) -> None:
    conn = [Conn(target.path)]
    examples = [0]

    @settings(
        max_examples=800,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request=requests)
    def one(request: dict[str, Any]) -> None:
        request = target.harmless(request)
        frame = _encode(request)
        reply = check_reply(frame, conn[0].exchange([frame])[0])
        target.created += _created_jobs(request, reply)
        target.cancel_created(conn[0])
        examples[0] += 1

    try:
        with Pinger(target.path) as pinger:
            one()
    finally:
        conn[0].close()  # a failing example must not leak it into a later test's warnings
    assert not pinger.failures, pinger.failures[:5]
    print(f"\nhypothesis: {examples[0]} request shapes, {pinger.count} pings meanwhile")
    target.finish()


def test_numbers_the_daemon_cannot_hold_are_refused_not_hung_on(target: Target) -> None:
    """A NaN timeout used to block `wait` on an active job forever (Condition.wait(nan))."""
    conn = Conn(target.path, timeout=10)
    blocker = target.blocker.id
    frames = [
        b'{"op":"wait","ids":[%d],"timeout":NaN}' % blocker,
        b'{"op":"wait","ids":[%d],"timeout":Infinity}' % blocker,
        b'{"op":"wait","ids":[%d],"timeout":1%s}' % (blocker, b"0" * 400),
        b'{"op":"show","id":%d}' % 2**63,
        b'{"op":"logs","id":%d,"offset":%d}' % (blocker, 2**63 - 1),
    ]
    began = time.monotonic()
    replies = [check_reply(f, line) for f, line in zip(frames, conn.exchange(frames), strict=True)]
    assert time.monotonic() - began < 5
    assert [r["ok"] for r in replies] == [False, False, False, False, True]
    assert "finite" in replies[0]["error"]["message"]
    assert "out of range" in replies[3]["error"]["message"]
    conn.close()
    target.finish()


def test_replies_bigger_than_a_request_still_reach_the_client(target: Target) -> None:
    """Two jobs with 3 MiB commands made every `status` fail for everyone (reply > 4 MiB)."""
    client = target.daemon.client()
    for _ in range(2):
        client.submit([NOWHERE, "x" * (3 * 2**20)], cwd="/", env={}, hold=True)
    assert len(client.status().jobs) == 3
    result = target.daemon.cli("status")
    assert result.returncode == 0, result.stderr
    target.finish()
