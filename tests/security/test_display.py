"""What people read: nothing a user submits writes into another person's terminal or the
daemon's log, and what `show_commands: false` hides stays hidden (issue 16, items 3 and 9).

Mallory submits jobs whose name, command and sweep values hold escape sequences, CR,
newlines that would forge rows, and bidi overrides; the victim and root then run the real
CLI on a pseudo-terminal (the CLI colours there, so it takes its terminal path).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import GpuschedError, UsageError
from tests.daemon_harness import RunningDaemon, eventually, read_until_closed
from tests.users import User, as_user

# Sequences a terminal would obey: clear screen, set the window title (OSC ... BEL),
# 8-bit CSI, a right-to-left override, and a CR that rewrites the start of the row.
ATTACK = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202egnp.exe\rX"
FORGED_ROW = "\n 9999  root        0,1     24G      1m  FORGEDROW"
SWEEP_VALUE = "SWEEPVALUE"
PATH_PART = "PATHPART"
ARGUMENT = "ARGUMENTVALUE"
FORGED_LOG = "\n2026-01-01 00:00:00,000 INFO gpusched.scheduling.scheduler: FORGEDLOG"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the CLI's own colours, on a terminal


def _run_cli(daemon: RunningDaemon, user: User | None, args: tuple[str, ...], tty: bool) -> str:
    """`gpusched ARGS` run as `user` (None: root), its stdout on a pseudo-terminal (`tty`)
    or a pipe; what it wrote.

    In a forked child that becomes the user and calls the CLI's entry point: the test's
    interpreter lives under /root, which a throw-away user may not execute.
    """
    leader, follower = pty.openpty() if tty else os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            os.close(leader)
            if user is not None:
                os.setgroups(user.groups())
                os.setgid(user.gid)
                os.setuid(user.uid)
                os.environ.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
            os.environ.update(GPUSCHED_CONFIG=str(daemon.config_path), COLUMNS="120")
            os.environ.pop("NO_COLOR", None)
            os.environ.pop("GPUSCHED_SOCKET", None)
            os.chdir("/")
            os.dup2(follower, 1)
            os.dup2(follower, 2)
            sys.stdout = sys.stderr = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            from gpusched.cli import cli

            try:
                cli.main(list(args), prog_name="gpusched")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(code)
    os.close(follower)
    received = read_until_closed(leader)
    _, status = os.waitpid(pid, 0)
    output = received.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, output
    # The terminal turns each "\n" into "\r\n" (onlcr): that CR is the pty's, not the job's.
    return output.replace("\r\n", "\n") if tty else output


def _cli_on_a_pty(daemon: RunningDaemon, user: User | None, *args: str) -> str:
    return _run_cli(daemon, user, args, tty=True)


def _cli_json(daemon: RunningDaemon, user: User, *args: str) -> Any:
    return json.loads(_run_cli(daemon, user, (*args, "--json"), tty=False))


def _assert_inert(screen: str) -> None:
    """Nothing in `screen` that a terminal would interpret, beyond the CLI's own colours."""
    text = SGR.sub("", screen)
    for char in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
        assert char not in text, f"{char!r} reached the terminal: {screen!r}"
    for line in text.splitlines():
        assert not line.lstrip().startswith(("9999", "FORGEDROW")), f"forged row: {screen!r}"


def _mallorys_jobs(daemon: RunningDaemon, mallory: User) -> dict[str, int]:
    socket_path = daemon.socket_path

    def submit() -> dict[str, int]:
        client = Client(socket_path)
        held = client.submit(
            ["sleep", "60", ATTACK + FORGED_ROW, ARGUMENT],
            name=ATTACK + FORGED_ROW,
            hold=True,
            cwd="/tmp",
        )
        ended = client.submit(["false", ATTACK + FORGED_ROW], name=ATTACK + FORGED_ROW, cwd="/tmp")
        swept = client.submit_sweep(
            ["true", "{token}"],
            [("token", [SWEEP_VALUE + ATTACK + FORGED_ROW])],
            name="public-name",
            cwd="/tmp",
        )
        # Held, then released: submit refuses a program that does not exist (issue 28);
        # the daemon's own report of the failed start is what is read here.
        unstartable = client.submit(
            [f"/nonexistent/{PATH_PART}{FORGED_LOG}"], name="nostart", cwd="/tmp", hold=True
        )
        client.release(unstartable.id)
        return {
            "held": held.id,
            "ended": ended.id,
            "swept": swept[0].id,
            "unstartable": unstartable.id,
        }

    ids: dict[str, int] = as_user(mallory, submit)
    for key in ("ended", "swept", "unstartable"):
        daemon.wait_state(ids[key], {"done", "failed"})
    return ids


def test_names_and_commands_cannot_write_into_other_peoples_terminals(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Fails before the fix: the ESC sequences, CR and newlines reached the victim's and
    root's terminals raw (a cleared screen, a window title, a forged row)."""
    mallory, victim = people
    daemon = root_daemon()
    ids = _mallorys_jobs(daemon, mallory)
    for user in (victim, None):  # another user, and root (who sees the commands too)
        for args in (
            ("status", "--all"),
            ("show", str(ids["held"])),
            ("show", str(ids["ended"])),
            ("history",),
            ("status", str(ids["held"]), str(ids["ended"])),
        ):
            screen = _cli_on_a_pty(daemon, user, *args)
            _assert_inert(screen)
    # Root sees mallory's name and command, escaped: what was sent, readably.
    shown = _cli_on_a_pty(daemon, None, "show", str(ids["held"]))
    assert "\\x1b]0;pwned\\x07" in shown
    assert "\\u202egnp.exe\\rX\\n 9999" in shown
    # JSON stays exact (its escapes are safe): the owner gets back what was submitted.
    job = _cli_json(daemon, mallory, "show", str(ids["held"]))
    assert job["name"] == ATTACK + FORGED_ROW
    assert daemon.client().ping()


def test_hidden_commands_stay_hidden_from_other_users(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Fails before the fix: a sweep's values were in the job's name, and a failed start's
    reason named the program's path, for every user to read."""
    mallory, victim = people
    daemon = root_daemon()  # show_commands: false, the default
    ids = _mallorys_jobs(daemon, mallory)
    socket_path = daemon.socket_path
    swept = ids["swept"]
    ids["requeued"] = as_user(mallory, lambda: Client(socket_path).requeue(swept).id)
    seen = [
        json.dumps(_cli_json(daemon, victim, "status", "--all")),
        json.dumps(_cli_json(daemon, victim, "history")),
        *(json.dumps(_cli_json(daemon, victim, "show", str(i))) for i in ids.values()),
        _cli_on_a_pty(daemon, victim, "status", "--all"),
        _cli_on_a_pty(daemon, victim, "history"),
        *(_cli_on_a_pty(daemon, victim, "show", str(i)) for i in ids.values()),
    ]
    for text in seen:
        for private in (SWEEP_VALUE, PATH_PART, ARGUMENT, "/nonexistent"):
            assert private not in text, f"{private} shown to {victim.name}: {text}"
    # Still visible to everyone: who, what state, and (not swept) the name.
    held = _cli_json(daemon, victim, "show", str(ids["held"]))
    assert held["user"] == mallory.name
    assert held["name"] == ATTACK + FORGED_ROW
    unstartable = _cli_json(daemon, victim, "show", str(ids["unstartable"]))
    assert (unstartable["state"], unstartable["reason"]) == ("failed", "failed_to_start")
    assert unstartable["reason_detail"] is None
    # The owner sees it all.
    mine = _cli_json(daemon, mallory, "show", str(ids["swept"]))
    assert SWEEP_VALUE in mine["name"]
    assert PATH_PART in _cli_json(daemon, mallory, "show", str(ids["unstartable"]))["reason_detail"]


def test_a_swept_name_keeps_to_the_name_limit(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Fails before the fix: --name (200) plus the sweep values made a 1,000+ character name."""
    mallory, _victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path

    def submit() -> list[str | None]:
        jobs = Client(socket_path).submit_sweep(
            ["true", "{v}"], [("v", ["x" * 1000])], name="n" * 200, hold=True, cwd="/tmp"
        )
        return [job.name for job in jobs]

    names = as_user(mallory, submit)
    assert names and all(name is not None and len(name) <= 200 for name in names)


def test_the_daemon_log_has_no_forged_lines_and_no_command_lines(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Fails before the fix: a newline in a program's path forged a log line, and every
    started job's full command line (with its arguments) was logged."""
    mallory, _victim = people
    daemon = root_daemon()
    ids = _mallorys_jobs(daemon, mallory)
    socket_path = daemon.socket_path
    job = as_user(mallory, lambda: Client(socket_path).submit(["true", ARGUMENT], cwd="/tmp").id)
    daemon.wait_state(job, {"done"})
    ended = f"job {ids['unstartable']} failed"
    eventually(lambda: ended in daemon.stderr())
    log = daemon.stderr()
    lines = log.splitlines()
    assert not [line for line in lines if "FORGEDLOG" in line and not line.startswith("20")]
    assert not [line for line in lines if line.startswith("2026-01-01 00:00:00,000")]
    for char in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
        assert char not in log
    assert ARGUMENT not in log  # show_commands is off: the program's name only
    assert re.search(rf'job {job} started on GPU .* as "{mallory.name}"', log)
    assert 'program "true"' in log


def test_crafted_inputs_get_one_line_errors_and_the_daemon_carries_on(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Fails before the fix: each of these was "internal error: ..." (OverflowError,
    ValueError: embedded null byte)."""
    mallory, victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path
    crafted: list[tuple[str, dict[str, Any]]] = [
        ("history", {"since": "0001-01-01T00:00:00+05:00"}),
        ("history", {"since": "9999-12-31T23:59:59-05:00"}),
        ("submit", {"command": ["true"], "cwd": "/tmp\x00/x"}),
        ("submit", {"command": ["true\x00"], "cwd": "/tmp"}),
        ("submit", {"command": ["true"], "cwd": "/tmp", "env": {"A\x00": "1"}}),
        ("submit", {"command": ["true"], "cwd": "/tmp", "env": {"A": "\x00"}}),
        ("submit", {"command": ["true"], "cwd": "/tmp", "name": "a\x00"}),
        ("submit", {"command": ["t", "{k}"], "cwd": "/tmp", "sweep": [["k", ["\x00"]]]}),
    ]
    for op, args in crafted:

        def send(op: str = op, args: dict[str, Any] = args) -> str:
            try:
                Client(socket_path).request(op, **args)
            except UsageError as exc:
                return exc.message
            except GpuschedError as exc:
                return f"{type(exc).__name__}: {exc.message}"
            return "accepted"

        message = as_user(mallory, send)
        assert "internal error" not in message and message != "accepted", (op, args, message)
        assert "\n" not in message
    for since in ("0001-01-01T00:00+05:00", "9999-12-31T23:59-05:00", "99999999999d"):
        result = daemon.cli("history", "--since", since)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    # Alive, and still scheduling for the others.
    job = as_user(victim, lambda: Client(socket_path).submit(["true"], cwd="/tmp").id)
    assert daemon.wait_state(job, {"done", "failed"})["state"] == "done"
    assert "internal error" not in daemon.stderr()


@pytest.mark.parametrize("raw", [False, True])
def test_another_users_output_reaches_roots_terminal_escaped(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], raw: bool
) -> None:
    """Fails before the fix: `gpusched logs` wrote mallory's escape sequences to root's
    terminal as they were. Mallory's own terminal, and --raw, get the bytes."""
    mallory, _victim = people
    daemon = root_daemon()
    socket_path = daemon.socket_path
    script = "printf 'line one\\n\\033]0;pwned\\007\\033[2J\\tend\\r\\n'"
    job = as_user(mallory, lambda: Client(socket_path).submit(["sh", "-c", script], cwd="/tmp").id)
    daemon.wait_state(job, {"done"})
    as_root = _cli_on_a_pty(daemon, None, "logs", str(job), *(["--raw"] if raw else []))
    if raw:
        assert "\x1b]0;pwned\x07" in as_root
    else:
        assert "\x1b" not in as_root and "\x07" not in as_root
        assert "line one\n\\x1b]0;pwned\\x07\\x1b[2J\tend\\r\n" in as_root
    own = _cli_on_a_pty(daemon, mallory, "logs", str(job))
    assert "\x1b]0;pwned\x07" in own
