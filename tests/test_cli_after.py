"""`gpusched submit --after ID[:ok|:any|:failed],...` on the command line: arrays (aN)
where ids are, the conditions shown by `show` (text and JSON) and in the waiting reason,
and a bad condition refused in one line. The scheduling of each condition is
tests/test_tick_after.py's.
"""

from __future__ import annotations

import json

import pytest

from tests.daemon_harness import RunningDaemon


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    return shared_daemon


@pytest.mark.parametrize(
    ("after", "words"),
    [
        ("3:maybe", "--after '3:maybe': expected ID, ID:ok, ID:any or ID:failed"),
        ("x3", "--after: invalid id 'x3'"),
        ("a1:failed", "--after a1:failed: an array does not fail as one"),
    ],
)
def test_a_bad_after_is_refused_in_one_line(daemon: RunningDaemon, after: str, words: str) -> None:
    result = daemon.cli("submit", "--after", after, "--", "true")
    lines = result.stderr.strip().splitlines()
    assert (result.returncode, len(lines)) == (2, 1), result.stderr
    assert words in lines[0]


def test_one_id_with_two_conditions_is_refused(daemon: RunningDaemon) -> None:
    first = daemon.submit("--hold", "--", "true")
    result = daemon.cli("submit", "--after", f"{first}:ok,{first}:failed", "--", "true")
    assert result.returncode == 2
    assert f"--after {first}: given as ok and as failed" in result.stderr


def test_show_gives_the_conditions_and_what_is_waited_for(daemon: RunningDaemon) -> None:
    first, second = (daemon.submit("--hold", "--", "true") for _ in range(2))
    then = daemon.submit("--after", f"{first},{second}:failed", "--", "true", fork=True)
    shown = daemon.show(then)
    assert (shown["after"], shown["after_when"]) == ([first, second], ["ok", "failed"])
    daemon.wait_reason(then, f"waiting for job {first}, {second} (to fail)")
    text = daemon.cli("show", str(then)).stdout
    assert f"{first},{second}:failed" in text
    assert "(to fail)" in text
    # Waiting for jobs, not for cards: when it starts is not knowable.
    assert shown["expected_start"] is None and "expected start: unknown" in text
    plain = daemon.submit("--after", str(first), "--", "true")
    assert daemon.show(plain)["after_when"] is None  # as before: every one must succeed


def test_after_an_array_waits_for_each_of_its_jobs(daemon: RunningDaemon) -> None:
    swept = json.loads(
        daemon.cli("submit", "--hold", "--json", "--sweep", "n=1,2", "--", "echo", "{n}").stdout
    )
    array, ids = swept[0]["array_id"], [job["id"] for job in swept]
    then = daemon.submit("--after", f"a{array}:any", "--", "true", fork=True)
    shown = daemon.show(then)
    assert (shown["after"], shown["after_when"]) == (ids, ["any", "any"])
    missing = daemon.cli("submit", "--after", "a99999", "--", "true")
    assert missing.returncode != 0
    assert len(missing.stderr.strip().splitlines()) == 1
