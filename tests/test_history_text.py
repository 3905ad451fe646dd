"""`gpusched history` as text: its STATE column names how each job ended, as sacct does
(timeout, oom, host_oom, node_lost... rather than "failed" or "lost" for all of them),
while `--json` keeps `state` and `reason` as they are; a long command is shortened to
the terminal's width as `status` shortens it.
"""

from __future__ import annotations

import json

import pytest

from gpusched.cli.history_view import ended_as, history_lines
from gpusched.core.models import EndReason, Job, JobState
from tests.daemon_harness import RunningDaemon

LONG = "python", "-c", "import time; " + "x = 1; " * 35 + "time.sleep(0)"


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    return shared_daemon


def _ended(state: JobState, reason: EndReason | None, **fields: object) -> Job:
    return Job(
        id=7,
        user="alice",
        uid=1000,
        command=list(LONG),
        cwd="/",
        state=state,
        reason=None if reason is None else str(reason),
        ended_at="2026-11-26T10:00:00+00:00",
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("state", "reason", "word"),
    [
        (JobState.DONE, EndReason.EXIT, "done"),
        (JobState.FAILED, EndReason.EXIT, "failed"),
        (JobState.FAILED, EndReason.TIMEOUT, "timeout"),
        (JobState.FAILED, EndReason.OOM, "oom"),
        (JobState.FAILED, EndReason.HOST_OOM, "host_oom"),
        (JobState.FAILED, EndReason.SIGNAL, "signal"),
        (JobState.FAILED, EndReason.OVERRUN, "overrun"),
        (JobState.FAILED, EndReason.FAILED_TO_START, "failed_to_start"),
        (JobState.CANCELLED, EndReason.CANCELLED, "cancelled"),
        (JobState.CANCELLED, EndReason.DEPENDENCY_FAILED, "dependency_failed"),
        (JobState.CANCELLED, EndReason.IDLE, "idle"),
        (JobState.LOST, EndReason.LOST, "lost"),
        (JobState.LOST, EndReason.NODE_LOST, "node_lost"),
        (JobState.LOST, None, "lost"),
    ],
)
def test_the_state_column_names_how_a_job_ended(
    state: JobState, reason: EndReason | None, word: str
) -> None:
    assert ended_as(_ended(state, reason)) == word
    header, line = history_lines([_ended(state, reason)], 100)
    assert line.split()[:3] == ["7", "alice", word]
    assert header.split()[2] == "STATE"


def test_every_end_reason_but_a_states_own_is_named() -> None:
    """A reason added later is named too: only `exit` and the reasons that are a state's
    name give the state."""
    states = {str(state) for state in JobState}
    for reason in EndReason:
        word = ended_as(_ended(JobState.FAILED, reason))
        assert word == ("failed" if reason == "exit" or reason in states else str(reason))


def test_a_long_command_is_shortened_to_the_width() -> None:
    lines = history_lines([_ended(JobState.DONE, EndReason.EXIT)], 100)
    assert all(len(line) <= 100 for line in lines)
    assert lines[1].split()[-1].endswith("...") or len(lines[1]) == 100


def test_history_on_the_command_line(daemon: RunningDaemon) -> None:
    long = daemon.submit("--", *LONG)
    timed_out = daemon.submit("--time", "1s", "--", "sleep", "30")
    daemon.client().wait([long, timed_out], timeout=30)
    env = {**daemon.env, "COLUMNS": "100"}
    text = daemon.cli("history", "--limit", "2", env=env).stdout.splitlines()
    assert all(len(line) <= 100 for line in text), text
    rows = {int(line.split()[0]): line.split() for line in text[1:]}
    assert rows[timed_out][2] == "timeout" and rows[long][2] == "done"
    listed = json.loads(daemon.cli("history", "--json", "--limit", "2").stdout)
    ended = {job["id"]: (job["state"], job["reason"]) for job in listed}
    assert ended[timed_out] == ("failed", "timeout")  # the JSON as it was
