"""Issue 26 item 8: a submit is idempotent by its request id. A retry of a submit whose
answer was lost (the daemon's reply dropped after its commit, or a database that did not
confirm the commit) answers the jobs the first try made, never a second copy; the client
retries by itself, and can ask what became of a submit.

The handlers over a real store (tests/world.py), and a real daemon behind a Unix-socket
relay that drops the first answer to a submit after the daemon has sent it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import (
    ConflictError,
    DaemonUnreachable,
    GpuschedError,
    NotFoundError,
    ProtocolError,
)
from gpusched.daemon.handlers import dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.submitter import send_submit
from tests.daemon_harness import RunningDaemon
from tests.fakes import GiB
from tests.world import World, make_world

ALICE = Caller(pid=101, uid=1000, gid=1000, user="alice", admin=False)
# Another user (root: an account every machine has; the handlers look the caller's up).
OTHER = Caller(pid=103, uid=0, gid=0, user="root", admin=True)
RID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = make_world(tmp_path, [24 * GiB])
    yield world
    world.scheduler.store.close()


def _ask(world: World, caller: Caller, op: str, **args: Any) -> Any:
    scheduler = world.scheduler
    services = Services(scheduler, scheduler.store, scheduler.context.settings, 0)
    return dispatch(services, caller, {"op": op, **args})


def _submit(world: World, caller: Caller, **args: Any) -> Any:
    spec = {"command": ["/bin/true"], "cwd": "/", "mem": GiB, "hold": True, **args}
    return _ask(world, caller, "submit", **spec)


def _count(world: World) -> int:
    return len(world.scheduler.store.jobs.active())


def test_a_retried_submit_answers_the_job_its_first_try_made(world: World) -> None:
    first = _submit(world, ALICE, request_id=RID)
    again = _submit(world, ALICE, request_id=RID)
    assert again["id"] == first["id"]
    assert _count(world) == 1
    other = _submit(world, ALICE, request_id=RID[::-1])  # another submit: another job
    assert other["id"] != first["id"]
    assert _count(world) == 2


def test_a_retried_sweep_answers_the_same_array(world: World) -> None:
    sweep = [["lr", ["0.1", "0.01", "0.001"]]]
    first = _submit(world, ALICE, request_id=RID, sweep=sweep, command=["/bin/echo", "{lr}"])
    again = _submit(world, ALICE, request_id=RID, sweep=sweep, command=["/bin/echo", "{lr}"])
    assert [j["id"] for j in again] == [j["id"] for j in first]
    assert _count(world) == 3


def test_another_user_s_request_id_is_refused(world: World) -> None:
    _submit(world, ALICE, request_id=RID)
    with pytest.raises(ConflictError):
        _submit(world, OTHER, request_id=RID)
    with pytest.raises(NotFoundError):  # nor can another learn what alice's submit made
        _ask(world, OTHER, "submitted", request_id=RID)


def test_the_client_can_ask_what_became_of_a_submit(world: World) -> None:
    with pytest.raises(NotFoundError):
        _ask(world, ALICE, "submitted", request_id=RID)
    made = _submit(world, ALICE, request_id=RID)
    assert [j["id"] for j in _ask(world, ALICE, "submitted", request_id=RID)] == [made["id"]]


@pytest.mark.parametrize("bad", ["short", "x" * 65, "has space1", "semi;colon"])
def test_a_malformed_request_id_is_refused(world: World, bad: str) -> None:
    with pytest.raises(ProtocolError):
        _submit(world, ALICE, request_id=bad)


class DroppingRelay:
    """A Unix socket in front of the daemon's: relays each connection, but closes the
    first connection that carries a submit once the daemon has answered, without passing
    the answer on: the submit committed, its client heard nothing."""

    def __init__(self, path: Path, daemon_path: Path) -> None:
        self.path, self.daemon_path = path, daemon_path
        self.dropped = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either side gone: the relay of it ends
            self._relay_one(client)

    def _relay_one(self, client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            upstream.connect(str(self.daemon_path))
            asked = client.recv(1 << 20)
            upstream.sendall(asked)
            answer = upstream.recv(1 << 20)
            if b'"submit"' in asked and self.dropped == 0:
                self.dropped += 1
                return  # the answer is lost
            client.sendall(answer)
            while answer:
                answer = upstream.recv(1 << 20)
                client.sendall(answer)

    def close(self) -> None:
        self.listener.close()


def test_a_submit_whose_answer_was_lost_is_retried_and_queued_once(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    relay = DroppingRelay(tmp_path / "relay.sock", daemon.socket_path)
    try:
        client = Client(relay.path)
        job = client.submit(["/bin/true"], mem="1G", hold=True)
    finally:
        relay.close()
    assert relay.dropped == 1  # the first answer was lost: the client tried again
    direct = daemon.client()
    mine = [j for j in direct.status().jobs if j.command[0].endswith("true")]
    assert [j.id for j in mine] == [job.id]  # one job, the one the client was told


REFUSED = (
    "the database db is unavailable (canceling statement due to lock timeout); nothing was changed"
)
UNCONFIRMED = (
    "the database db is unavailable (no answer from the database within 5 s); what was asked"
    " may have been done, in whole or in part: look before asking again"
)


class Answers:
    """A submit's tries, each answered in turn: an error to raise, or a reply."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.tries = 0

    def __call__(self) -> Any:
        answer = self.answers[self.tries]
        self.tries += 1
        if isinstance(answer, GpuschedError):
            raise answer
        return answer


def test_a_submit_refused_with_nothing_changed_is_said_at_once_and_as_it_is() -> None:
    """Found with a sweep cut mid-pipeline (tests/test_partitions.py): every refusal
    took three tries, 8 s, and said "nothing was changed (... it may have been queued)"."""
    tries = Answers(GpuschedError(REFUSED), "never asked")
    with pytest.raises(GpuschedError) as raised:
        send_submit(tries, "r1", Path("/run/gpusched.sock"))
    assert tries.tries == 1
    assert str(raised.value) == REFUSED


def test_a_submit_whose_commit_was_not_confirmed_is_retried_and_answered() -> None:
    tries = Answers(GpuschedError(UNCONFIRMED), {"jobs": [7]})
    assert send_submit(tries, "r1", Path("/run/gpusched.sock")) == {"jobs": [7]}
    assert tries.tries == 2


def test_a_retry_refused_after_a_lost_answer_still_says_the_first_try_may_be_queued() -> None:
    tries = Answers(GpuschedError(UNCONFIRMED), GpuschedError(REFUSED))
    with pytest.raises(GpuschedError) as raised:
        send_submit(tries, "r1", Path("/run/gpusched.sock"))
    said = str(raised.value)
    assert tries.tries == 2
    assert "the first try may have been queued" in said and "submit request r1" in said, said
    assert "\n" not in said


def test_a_submit_whose_answers_stay_lost_says_it_may_be_queued() -> None:
    lost = [GpuschedError(UNCONFIRMED) for _ in range(3)]
    tries = Answers(*lost, "never asked")
    with pytest.raises(GpuschedError, match="it may have been queued"):
        send_submit(tries, "r1", Path("/run/gpusched.sock"))
    assert tries.tries == 3  # the first try and its two retries


# libpq's own words as PostgreSQL restarts (psycopg quotes them): "closed the connection"
# inside a refusal that says nothing was changed.
RESTARTING = (
    "the database db is unavailable (consuming input failed: server closed the connection"
    " unexpectedly); nothing was changed"
)


def test_a_refusal_quoting_the_driver_s_closed_connection_is_said_at_once() -> None:
    """A submit during a PostgreSQL restart: refused before any COMMIT, in libpq's words.
    Before, those words read as this client's own lost answer: retried twice, then told
    "the first try may have been queued"."""
    tries = Answers(GpuschedError(RESTARTING), "never asked")
    with pytest.raises(GpuschedError) as raised:
        send_submit(tries, "r1", Path("/run/gpusched.sock"))
    assert tries.tries == 1
    assert str(raised.value) == RESTARTING


def test_a_daemon_that_closed_the_connection_is_a_lost_answer_and_retried() -> None:
    closed = DaemonUnreachable("the gpusched daemon at /run/gpusched.sock closed the connection")
    silent = DaemonUnreachable(
        "the gpusched daemon at /run/gpusched.sock stopped answering (timed out)"
    )
    tries = Answers(closed, silent, {"jobs": [7]})
    assert send_submit(tries, "r1", Path("/run/gpusched.sock")) == {"jobs": [7]}
    assert tries.tries == 3
