"""The wire protocol: framing over a real socket, decoding limits, errors as values."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.errors import ERROR_KINDS, GpuschedError, ProtocolError
from gpusched.core.requests.protocol import (
    MAX_FRAME_BYTES,
    MAX_JSON_DEPTH,
    decode,
    encode,
    error_from_reply,
    error_reply,
    ok_reply,
    peer_credentials,
    read_frame,
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def nested(depth: int) -> dict[str, Any]:
    """`depth` nested objects, the innermost empty."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


# -- encode / decode ----------------------------------------------------------------------


def test_round_trip() -> None:
    message = {
        "op": "submit",
        "command": ["python", "train.py", "--name", "résumé ☃"],
        "env": {"PATH": "/usr/bin", "EMPTY": ""},
        "mem": 24 * 2**30,
        "priority": -3,
        "hold": False,
        "name": None,
        "ratio": 0.5,
    }
    data = encode(message)
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1  # one line, whatever the strings hold
    assert decode(data[:-1]) == message


def test_newlines_inside_strings_stay_inside_the_frame() -> None:
    message = {"op": "submit", "command": ["sh", "-c", "echo a\necho b\r\n"]}
    data = encode(message)
    assert data.count(b"\n") == 1
    assert decode(data.rstrip(b"\n")) == message


def test_strings_from_non_utf8_bytes_round_trip() -> None:
    """os.environ and sys.argv hold undecodable bytes as lone surrogates (PEP 383).

    A submitter whose environment or arguments are not valid UTF-8 must still be able
    to submit, and the daemon must get back exactly the same strings so the job sees
    exactly the same bytes.
    """
    value = os.fsdecode(b"caf\xe9")  # Latin-1 bytes in a UTF-8 locale
    message = {"op": "submit", "env": {"PROJECT": value}, "command": ["ls", value]}
    data = encode(message)
    back = decode(data[:-1])
    assert back == message
    assert os.fsencode(back["env"]["PROJECT"]) == b"caf\xe9"


def test_encode_refuses_oversize_messages() -> None:
    with pytest.raises(ProtocolError, match="too large"):
        encode({"blob": "x" * MAX_FRAME_BYTES})


def test_decode_accepts_a_frame_at_the_limit() -> None:
    filler = MAX_FRAME_BYTES - len(b'{"x":""}')
    frame = b'{"x":"' + b"y" * filler + b'"}'
    assert len(frame) == MAX_FRAME_BYTES
    assert len(decode(frame)["x"]) == filler


def test_decode_refuses_oversize_frames() -> None:
    frame = b'{"x":"' + b"y" * MAX_FRAME_BYTES + b'"}'
    with pytest.raises(ProtocolError, match="too large"):
        decode(frame)


@pytest.mark.parametrize(
    "frame",
    [b"", b"not json", b"{", b'{"a":1}{"b":2}', b"{'a': 1}", b'{"a": NaN'],
)
def test_decode_refuses_non_json(frame: bytes) -> None:
    with pytest.raises(ProtocolError, match="not valid UTF-8 JSON"):
        decode(frame)


@pytest.mark.parametrize("frame", [b'{"a":"\xff"}', b"\xfe\xff{}", b'{"a":"\xc3"}'])
def test_decode_refuses_non_utf8(frame: bytes) -> None:
    with pytest.raises(ProtocolError, match="UTF-8"):
        decode(frame)


@pytest.mark.parametrize("frame", [b"[]", b'[{"op":"ping"}]', b"42", b'"ping"', b"null", b"true"])
def test_decode_refuses_non_objects(frame: bytes) -> None:
    with pytest.raises(ProtocolError, match="JSON object"):
        decode(frame)


def test_decode_depth_limit() -> None:
    assert decode(json.dumps(nested(MAX_JSON_DEPTH)).encode()) == nested(MAX_JSON_DEPTH)
    with pytest.raises(ProtocolError, match="nested deeper"):
        decode(json.dumps(nested(MAX_JSON_DEPTH + 1)).encode())


def test_decode_depth_limit_counts_lists_too() -> None:
    frame = b'{"a":' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
    with pytest.raises(ProtocolError, match="nested deeper"):
        decode(frame)


def test_decode_survives_pathological_nesting() -> None:
    """Deep enough to blow the json module's recursion: still a ProtocolError, not a crash."""
    frame = b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(ProtocolError):
        decode(frame)


# Any text, including lone surrogates (how Python holds undecodable bytes from the OS).
any_text = st.text(st.characters(categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cs"]))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(any_text, json_values, max_size=6))
def test_any_json_object_round_trips(message: dict[str, Any]) -> None:
    data = encode(message)
    assert data.endswith(b"\n")
    assert b"\n" not in data[:-1]
    assert decode(data[:-1]) == message


# -- read_frame over a real socket --------------------------------------------------------


def test_several_frames_in_one_send(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(encode({"n": 1}) + encode({"n": 2}) + encode({"n": 3}))
    a.shutdown(socket.SHUT_WR)
    buffer = bytearray()
    frames = [read_frame(b, buffer) for _ in range(4)]
    assert [decode(f) for f in frames[:3] if f is not None] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert frames[3] is None
    assert buffer == bytearray()


def test_frame_split_over_sends(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    data = encode({"op": "status", "all": True, "pad": "é" * 100})
    received: list[bytes | None] = []

    def reader() -> None:
        received.append(read_frame(b, bytearray()))

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(0, len(data), 7):  # splits a two-byte character too
        a.sendall(data[i : i + 7])
    thread.join(timeout=10)
    assert received == [data[:-1]]


def test_frame_bigger_than_one_recv(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    message = {"env": {f"VAR{i}": "v" * 100 for i in range(2000)}}  # ~230 KB
    data = encode(message)
    sender = threading.Thread(target=a.sendall, args=(data,))
    sender.start()
    frame = read_frame(b, bytearray())
    sender.join(timeout=10)
    assert frame is not None
    assert decode(frame) == message


def test_bytes_after_the_newline_stay_in_the_buffer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(encode({"n": 1}) + b'{"n":')
    buffer = bytearray()
    assert read_frame(b, buffer) == b'{"n":1}'
    assert buffer == bytearray(b'{"n":')
    a.sendall(b"2}\n")
    assert read_frame(b, buffer) == b'{"n":2}'


def test_truncated_frame_at_eof(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b'{"op":"pi')
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="middle of a frame"):
        read_frame(b, bytearray())


def test_clean_eof(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.close()
    assert read_frame(b, bytearray()) is None


def test_endless_frame_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer that never sends a newline cannot make us buffer without bound."""
    a, b = pair
    chunk = b"x" * 65536
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set():
                a.sendall(chunk)
        except OSError:
            pass  # the reader gave up and the test closed the socket

    sender = threading.Thread(target=flood)
    sender.start()
    buffer = bytearray()
    try:
        with pytest.raises(ProtocolError, match="too large"):
            read_frame(b, buffer)
        assert len(buffer) <= MAX_FRAME_BYTES + 65536
    finally:
        stop.set()
        b.close()
        a.shutdown(socket.SHUT_RDWR)
        sender.join(timeout=10)


# -- replies and errors -------------------------------------------------------------------


def test_ok_reply() -> None:
    reply = decode(encode(ok_reply({"id": 3}))[:-1])
    assert reply == {"ok": True, "result": {"id": 3}}


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
def test_every_error_kind_round_trips(kind: str) -> None:
    cls = ERROR_KINDS[kind]
    assert cls.kind == kind
    original = cls(f"something about {kind} went wrong")
    reply = decode(encode(error_reply(original))[:-1])
    assert reply["ok"] is False
    assert reply["error"] == {"kind": kind, "message": f"something about {kind} went wrong"}
    again = error_from_reply(reply)
    assert type(again) is cls
    assert again.message == original.message
    assert again.exit_code == original.exit_code


def test_unknown_error_kind_is_a_generic_error() -> None:
    error = error_from_reply({"ok": False, "error": {"kind": "martian", "message": "hm"}})
    assert type(error) is GpuschedError
    assert error.message == "hm"


@pytest.mark.parametrize(
    "reply", [{"ok": False}, {"ok": False, "error": "boom"}, {"ok": False, "error": None}]
)
def test_malformed_error_reply(reply: dict[str, Any]) -> None:
    assert isinstance(error_from_reply(reply), ProtocolError)


def test_error_without_message() -> None:
    error = error_from_reply({"ok": False, "error": {"kind": "not_found"}})
    assert type(error) is ERROR_KINDS["not_found"]
    assert error.message


# -- peer credentials ---------------------------------------------------------------------


def test_peer_credentials_are_our_own(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())
    assert peer_credentials(b) == (os.getpid(), os.getuid(), os.getgid())


def test_peer_credentials_over_a_listening_socket(tmp_path: Any) -> None:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(1)
        client.connect(path)
        conn, _ = server.accept()
        with conn:
            assert peer_credentials(conn) == (os.getpid(), os.getuid(), os.getgid())
    finally:
        client.close()
        server.close()
