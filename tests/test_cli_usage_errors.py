"""Bad usage reads as every other error: one `gpusched: ...` line naming what is wrong
(and the limit, where there is one), exit 2; never click's three-line usage block. The
real command line, forked; a daemon only where the daemon judges the value."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.daemon_harness import RunningDaemon, run_cli


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["show", "abc"], "gpusched: show: invalid value for 'JOB_ID': 'abc' is not a job id"),
        (["wait"], "gpusched: wait: missing argument 'IDS...'"),
        (["logs"], "gpusched: logs: missing argument 'JOB_ID'"),
        (["status", "--limit", "-1"], "gpusched: status: invalid value for '--limit': -1 is not"),
        (["--bogus"], "gpusched: no such option '--bogus'"),
        (["admin", "prune"], "gpusched: admin prune: missing option '--ended-before'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], said: str, tmp_path: Path) -> None:
    env = {**os.environ, "GPUSCHED_SOCKET": str(tmp_path / "none.sock")}
    env.pop("GPUSCHED_CONFIG", None)
    done = run_cli(*args, env=env)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(said), done.stderr
    assert "Usage:" not in done.stderr and "Error:" not in done.stderr


def test_a_number_out_of_range_names_the_bound(daemon: RunningDaemon) -> None:
    done = daemon.cli("submit", "--priority", "99999999999999999999", "--", "true")
    assert done.returncode == 2, done
    assert done.stderr == (
        "gpusched: 'priority' is out of range: 99999999999999999999 is not between"
        " -9223372036854775808 and 9223372036854775807\n"
    )
