"""The request handlers, called through `handlers.dispatch` with no socket and no process.

A real Store (SQLite in a temp dir) and a real Scheduler on the test doubles of its
launcher, GPUs and clock (tests/fakes.py), as tests/world.py builds it; callers are
`Caller` values for two users and root, as the server would make from SO_PEERCRED.
Submits that pass their checks are made as root (uid 0), whose working directory is not
checked by a child process; users' jobs are queued through the scheduler directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from gpusched.core.errors import (
    GpuschedError,
    NotFoundError,
    PermissionDenied,
    ProtocolError,
    UsageError,
)
from gpusched.core.models import JobState
from gpusched.core.requests.catalog import REQUESTS
from gpusched.core.requests.protocol import WIRE_REPLY_BYTES, encode
from gpusched.daemon.auth import HIDDEN_COMMAND
from gpusched.daemon.handlers import HANDLERS, dispatch
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.store import NewJob, TimelineRow, TimelineWrite
from tests.fakes import GiB
from tests.world import World, make_world

ALICE = Caller(pid=101, uid=1000, gid=1000, user="alice", admin=False)
BOB = Caller(pid=102, uid=1001, gid=1001, user="bob", admin=False)
ROOT = Caller(pid=103, uid=0, gid=0, user="root", admin=True)


class Daemon:
    """The handlers' view of a daemon: its Services, and a way to queue a user's job."""

    def __init__(self, world: World, owner_uid: int = 0) -> None:
        self.world = world
        scheduler = world.scheduler
        self.services = Services(scheduler, scheduler.store, scheduler.context.settings, owner_uid)

    def ask(self, caller: Caller, op: str, **args: Any) -> Any:
        return dispatch(self.services, caller, {"op": op, **args})

    def queue(self, caller: Caller, **spec: Any) -> int:
        new = NewJob(
            user=caller.user,
            uid=caller.uid,
            gid=caller.gid,
            command=spec.pop("command", ["train.py", "--secret", "s3cr3t"]),
            cwd=spec.pop("cwd", "/home/private/project"),
            env={},
            umask=0o022,
            mem=spec.pop("mem", 8 * GiB),
            **spec,
        )
        return self.world.scheduler.submit(new).id

    def state(self, job_id: int) -> JobState:
        return self.world.state(job_id)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    world = make_world(tmp_path, [24 * GiB])
    yield Daemon(world)
    world.scheduler.store.close()


# -- submit: each bad field is refused with its own message, and nothing is queued ----------

VALID = {"command": ["python", "train.py"], "cwd": "/", "mem": 8 * GiB}


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"command": []}, UsageError, "no command given"),
        ({"command": [""]}, UsageError, "no command given"),
        ({"command": ["x", 3]}, ProtocolError, "'command' must be a list of strings"),
        ({"cwd": None}, ProtocolError, "request is missing 'cwd'"),
        ({"cwd": "relative/dir"}, UsageError, "must be an absolute path"),
        ({"cwd": "/tmp/\x00x"}, UsageError, "NUL character"),
        ({"env": {"A": 1}}, ProtocolError, "'env' must map strings to strings"),
        ({"mem": 0}, UsageError, "--mem must be more than zero"),
        ({"mem": True}, ProtocolError, "'mem' must be an integer"),
        ({"mem": 2**64}, UsageError, "'mem' is out of range"),
        ({"gpus": 0}, UsageError, "--gpus must be at least 1"),
        ({"umask": 0o1000}, ProtocolError, "'umask' must be between 0 and 0o777"),
        ({"name": "n" * 10_000}, UsageError, "--name is limited to"),
        ({"time": -1}, UsageError, "--time must be more than zero"),
        ({"time": float("nan")}, UsageError, "must be a finite number"),
        ({"max_concurrent": 2}, UsageError, "--max-concurrent applies to a --sweep array"),
        ({"retry_oom": 11}, UsageError, "--retry-oom must be between 0 and 10"),
        ({"notify": [""]}, UsageError, "--notify: expected a command"),
        ({"sweep": [["lr"]]}, ProtocolError, "'sweep' must be a list of"),
        ({"after": [True]}, ProtocolError, "'after' must be a list of job ids"),
    ],
)
def test_a_bad_submit_is_refused_with_its_reason_and_queues_nothing(
    daemon: Daemon, change: dict[str, Any], error: type[GpuschedError], message: str
) -> None:
    with pytest.raises(error, match=message):
        daemon.ask(ROOT, "submit", **{**VALID, **change})
    assert daemon.ask(ROOT, "status")["jobs"] == []


def test_a_good_submit_queues_one_job_or_one_array(daemon: Daemon) -> None:
    one = daemon.ask(ROOT, "submit", **VALID, name="solo")
    assert (one["command"], one["name"], one["state"]) == (VALID["command"], "solo", "queued")
    sweep = {"command": ["train.py", "--lr={lr}"], "sweep": [["lr", ["0.1", "0.2"]]]}
    swept = daemon.ask(ROOT, "submit", **{**VALID, **sweep})
    assert [j["command"][-1] for j in swept] == ["--lr=0.1", "--lr=0.2"]
    assert len({j["array_id"] for j in swept}) == 1
    assert [j["id"] for j in daemon.ask(ROOT, "status")["jobs"]] == [one["id"]] + [
        j["id"] for j in swept
    ]


# -- authorization: another user's job is refused, and left as it was ----------------------


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("cancel", {}),
        ("hold", {}),
        ("release", {}),
        ("priority", {"priority": 9}),
        ("requeue", {}),
        ("logs", {}),
    ],
)
def test_another_users_job_is_refused(daemon: Daemon, op: str, args: dict[str, Any]) -> None:
    job = daemon.queue(ALICE, held=op == "release")
    if op == "requeue":  # only an ended job can be requeued
        daemon.ask(ALICE, "cancel", id=job)
    before = daemon.ask(ALICE, "show", id=job)
    with pytest.raises(PermissionDenied, match=f"job {job} belongs to alice"):
        daemon.ask(BOB, op, id=job, **args)
    assert daemon.ask(ALICE, "show", id=job) == before
    # The owner may, and so may an administrator.
    daemon.ask(ALICE, op, id=job, **args)
    other = daemon.queue(ALICE, held=op == "release")
    if op == "requeue":
        daemon.ask(ALICE, "cancel", id=other)
    daemon.ask(ROOT, op, id=other, **args)


def test_cancel_by_array_or_mine_touches_only_the_callers_jobs(daemon: Daemon) -> None:
    alices = daemon.queue(ALICE)
    sweep = {"command": ["train.py", "{lr}"], "sweep": [["lr", ["1", "2"]]]}
    swept = daemon.ask(ROOT, "submit", **{**VALID, **sweep})
    with pytest.raises(PermissionDenied, match="belongs to root"):
        daemon.ask(BOB, "cancel", array=swept[0]["array_id"])
    assert [j["id"] for j in daemon.ask(BOB, "cancel", mine=True)] == []
    assert daemon.state(alices) == JobState.QUEUED
    assert {daemon.state(j["id"]) for j in swept} == {JobState.QUEUED}


# -- visible(): what another user sees of a job --------------------------------------------


def _swept_job_of_alice(daemon: Daemon) -> int:
    news = [
        NewJob(
            user="alice",
            uid=ALICE.uid,
            gid=ALICE.gid,
            command=["train.py", f"--token={token}"],
            cwd="/home/alice/secret-project",
            env={},
            umask=0o022,
            mem=GiB,
            name=f"run token={token}",
            notify=("mail", "alice@example.org"),
        )
        for token in ("hunter2", "swordfish")
    ]
    return daemon.world.scheduler.submit_many(news, as_array=True)[0].id


def test_another_user_sees_no_command_cwd_hook_or_swept_name(daemon: Daemon) -> None:
    job = _swept_job_of_alice(daemon)
    seen = daemon.ask(BOB, "show", id=job)
    assert seen["command"] == HIDDEN_COMMAND
    assert seen["cwd"] is None
    assert seen["notify"] == HIDDEN_COMMAND
    assert seen["name"] is None
    assert (seen["user"], seen["id"]) == ("alice", job)  # who and which still show
    assert "hunter2" not in repr(daemon.ask(BOB, "status"))
    assert "hunter2" not in repr(daemon.ask(BOB, "array", array=seen["array_id"]))
    for caller in (ALICE, ROOT):  # the owner and an administrator see it all
        mine = daemon.ask(caller, "show", id=job)
        assert mine["command"] == ["train.py", "--token=hunter2"]
        assert (mine["cwd"], mine["name"]) == ("/home/alice/secret-project", "run token=hunter2")
        assert mine["notify"] == ["mail", "alice@example.org"]


def test_an_unswept_jobs_name_shows_to_others(daemon: Daemon) -> None:
    job = daemon.queue(ALICE, name="resnet")
    assert daemon.ask(BOB, "show", id=job)["name"] == "resnet"


def test_show_commands_shows_them_to_everyone_after_a_reload(daemon: Daemon) -> None:
    job = _swept_job_of_alice(daemon)
    settings = daemon.services.settings
    settings.replace(replace(settings.current, show_commands=True))  # as a SIGHUP reload does
    assert daemon.ask(BOB, "show", id=job)["command"] == ["train.py", "--token=hunter2"]


# -- status pages, wait, drain --------------------------------------------------------------


def test_status_pages_through_every_active_job_once(daemon: Daemon) -> None:
    ids = [daemon.queue(ALICE if n % 2 else BOB) for n in range(7)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while pages < 10:  # a cursor that never advances fails here, not by hanging
        page = daemon.ask(ALICE, "status", limit=3, cursor=cursor)
        assert len(page["jobs"]) <= 3
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == ids
    assert pages == 3
    assert page["counts"]["queued"] == 7
    with pytest.raises(UsageError, match="only queued, held and running"):
        daemon.ask(ALICE, "status", states=["failed"])


def test_a_status_page_stays_under_a_megabyte_and_the_client_joins_the_pages(
    daemon: Daemon,
) -> None:
    """Issue 30: every wire reply bounded (1 MB). 40 queued jobs of 60 KB commands (2.4 MB,
    within a page's job count): each `status` page is at most WIRE_REPLY_BYTES on the wire
    and the pages together list every job once, in order."""
    ids = [daemon.queue(ALICE, command=["train.py", f"{n}" * 60_000]) for n in range(40)]
    seen: list[int] = []
    cursor = None
    for _ in range(40):  # a cursor that never advances fails here, not by hanging
        page = daemon.ask(ALICE, "status", cursor=cursor)
        assert len(encode({"ok": True, "result": page})) <= WIRE_REPLY_BYTES
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == ids


def test_wait_answers_each_job_once_however_often_named(daemon: Daemon) -> None:
    job = daemon.queue(ALICE)
    daemon.ask(ALICE, "cancel", id=job)
    reply = daemon.ask(ALICE, "wait", ids=[job, job, job], timeout=0)
    assert [j["id"] for j in reply] == [job]
    assert reply[0]["state"] == "cancelled"
    with pytest.raises(NotFoundError, match=f"no job {job + 1}"):
        daemon.ask(ALICE, "wait", ids=[job, job + 1], timeout=0)
    with pytest.raises(UsageError, match="no job ids"):
        daemon.ask(ALICE, "wait", ids=[])


def test_only_an_administrator_may_drain(daemon: Daemon) -> None:
    with pytest.raises(PermissionDenied, match="only an administrator"):
        daemon.ask(ALICE, "drain", on=True, reason="mine now")
    assert daemon.world.scheduler.drain is None
    assert daemon.ask(ALICE, "status")["drain"] is None
    drained = daemon.ask(ROOT, "drain", on=True, reason="driver update")
    assert (drained["by"], drained["reason"]) == ("root", "driver update")
    assert daemon.ask(BOB, "status")["drain"] == drained
    with pytest.raises(PermissionDenied, match="only an administrator"):
        daemon.ask(BOB, "drain", on=False)
    assert daemon.world.scheduler.drain is not None
    assert daemon.ask(ROOT, "drain", on=False) is None


# -- dispatch itself ------------------------------------------------------------------------


def test_an_unknown_request_is_a_protocol_error(daemon: Daemon) -> None:
    for op in ("format_disk", None, 3, ["ping"]):
        with pytest.raises(ProtocolError, match="unknown request"):
            dispatch(daemon.services, ALICE, {"op": op})


def test_a_users_daemon_serves_only_that_user(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB])
    own = Daemon(world, owner_uid=ALICE.uid)
    try:
        assert own.ask(ALICE, "ping")["single_user"] is True
        with pytest.raises(PermissionDenied, match="serves only that user"):
            own.ask(BOB, "ping")
    finally:
        world.scheduler.store.close()


def test_every_request_has_a_handler_that_takes_its_type() -> None:
    assert set(HANDLERS) == set(REQUESTS)
    for op, handler in HANDLERS.items():
        hints = get_type_hints(handler)
        taken = [hint for name, hint in hints.items() if name not in ("services", "caller")]
        assert taken[0] is REQUESTS[op], op


def test_show_gives_the_timeline_only_when_asked_and_to_anyone_who_may_see_the_job(
    daemon: Daemon,
) -> None:
    job = daemon.queue(ALICE)
    rows = (TimelineRow(1_735_689_600.0, 3 * GiB, 40.0), TimelineRow(1_735_689_660.5, None, None))
    daemon.services.store.usage.set_usage(job, timeline=TimelineWrite(rows))
    assert "timeline" not in daemon.ask(ALICE, "show", id=job)
    expected = [
        {"t": "2025-01-01T00:00:00.000+00:00", "memory": 3 * GiB, "util": 40.0},
        {"t": "2025-01-01T00:01:00.500+00:00", "memory": None, "util": None},
    ]
    for caller in (ALICE, BOB, ROOT):  # what status and history show to all, over time
        assert daemon.ask(caller, "show", id=job, timeline=True)["timeline"] == expected
    assert daemon.ask(ALICE, "show", id=daemon.queue(ALICE), timeline=True)["timeline"] == []
    with pytest.raises(ProtocolError):
        daemon.ask(ALICE, "show", id=job, timeline="yes")
