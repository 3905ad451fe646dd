"""The request types (gpusched.core.requests.catalog, read by gpusched.core.requests.wire): what the
wire may carry, what each request refuses on its own, and that the client and the daemon
read them the same way.

No daemon here: the handlers' use of them is tests/test_handlers.py, the socket's is
tests/test_protocol_fuzz.py (which fuzzes every field these classes declare).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.client import Client
from gpusched.core.errors import NotFoundError, ProtocolError, UsageError
from gpusched.core.requests import catalog as rq
from gpusched.core.requests.wire import parse

SUBMIT = {"op": "submit", "command": ["python", "train.py"], "cwd": "/work"}


def test_a_frame_becomes_its_typed_request_and_back() -> None:
    frame = {**SUBMIT, "after": [3, 2, 3], "sweep": [["lr", ["0.1", "0.2"]]], "time": 60}
    request = parse(frame)
    assert isinstance(request, rq.SubmitRequest)
    assert request.command == ("python", "train.py")
    assert request.after == (3, 2)  # each id once, in the order first given
    assert request.sweep == (("lr", ("0.1", "0.2")),)
    assert request.time == 60.0
    assert parse(request.to_wire()) == request


def test_every_request_kind_survives_the_wire_with_its_defaults() -> None:
    required: dict[str, Any] = {"id": 1, "priority": 2, "array": 3, "on": True}
    required.update(command=("x",), cwd="/", ids=(1,), ended_before_s=86400.0)
    required.update(request_id="0123456789abcdef")
    for op, kind in rq.REQUESTS.items():
        names = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
        request = kind(**{k: v for k, v in required.items() if k in names})
        assert request.op == op
        assert parse(request.to_wire()) == request


@pytest.mark.parametrize(
    ("frame", "error", "message"),
    [
        ({"op": "reboot"}, ProtocolError, "unknown request 'reboot'"),
        ({"op": "show"}, ProtocolError, "request is missing 'id'"),
        ({"op": "show", "id": 0}, NotFoundError, "no job 0"),
        ({"op": "show", "id": "7"}, ProtocolError, "'id' must be an integer"),
        ({"op": "cancel"}, ProtocolError, "request is missing 'id'"),
        ({"op": "wait", "ids": []}, UsageError, "no job ids to wait for"),
        ({"op": "wait", "ids": list(range(1, 10_002))}, UsageError, "at most 10000 job ids"),
        ({"op": "history", "since": "yesterday"}, UsageError, "not an ISO date"),
        ({"op": "history", "states": ["running"]}, UsageError, "an ended job is one of"),
        ({"op": "status", "states": ["done"]}, UsageError, "only queued, held and running"),
        ({"op": "drain", "on": True, "reason": ""}, UsageError, "a drain reason is 1 to"),
        ({"op": "drain", "on": "yes"}, ProtocolError, "'on' has the wrong type"),
        ({**SUBMIT, "env": {"A": ["B"]}}, ProtocolError, "'env' must map strings to strings"),
        ({**SUBMIT, "sweep": [["lr", "0.1"]]}, ProtocolError, "'sweep' must be a list of"),
        ({**SUBMIT, "name": "a\udcffb"}, UsageError, "not valid UTF-8"),
        ({**SUBMIT, "command": ["py\x00"]}, UsageError, "NUL character"),
        ({**SUBMIT, "time": 10**400}, UsageError, "'time' is out of range"),
        ({**SUBMIT, "time": float("nan")}, UsageError, "'time' must be a finite number"),
    ],
)
def test_a_bad_frame_is_refused_with_one_line(
    frame: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        parse(frame)


def test_history_since_is_held_in_utc_as_ends_are_stored() -> None:
    request = parse({"op": "history", "since": "2026-11-25T14:00:00+02:00"})
    assert isinstance(request, rq.HistoryRequest)
    assert request.since is not None and request.since.startswith("2026-11-25T12:00:00")


def test_an_empty_notify_means_no_hook() -> None:
    assert parse({**SUBMIT, "notify": []}) == parse(SUBMIT)


@given(
    st.dictionaries(
        st.sampled_from(sorted(f.name for f in dataclasses.fields(rq.SubmitRequest))), st.none()
    )
)
def test_null_means_the_default(nulls: dict[str, None]) -> None:
    required = {"command", "cwd"}
    if required & set(nulls):
        with pytest.raises(ProtocolError, match="request is missing"):
            parse({**SUBMIT, **nulls})
    else:
        assert parse({**SUBMIT, **nulls}) == parse(SUBMIT)


def test_the_client_refuses_a_bad_request_before_opening_the_socket(tmp_path: Path) -> None:
    """The same words as the daemon's, and no "cannot reach the daemon" for a typo."""
    client = Client(socket_path=tmp_path / "nobody-listens.sock")
    with pytest.raises(UsageError, match="--gpus must be at least 1"):
        client.submit(["python", "train.py"], gpus=0)
    with pytest.raises(UsageError, match="--retry-oom must be between 0 and 10"):
        client.submit(["python", "train.py"], retry_oom=11)
    with pytest.raises(NotFoundError, match="no job 0"):
        client.job(0)
