"""The fast path (cli/fast.py) and the click commands agree (issue 30: a path that bypasses
click is allowed only with this test).

Every command line of the table runs twice against one real daemon: through `main()`, as
the `gpusched` script runs it (the fast path where it understands the form), and through
the click group alone (cli/group.py, the path before the fast one existed). Their stdout,
stderr and exit code must be the same: good forms, `--help`, an unknown option, a missing
value, a bad size, an unknown job id, a form the fast path leaves to click, and no daemon
at all. Each run also says whether it imported click, so the table also checks which forms
the fast path takes (a fast path that took none would agree trivially).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import RunningDaemon, eventually

# Each runner writes to $TAKEN whether click was imported, once the command has ended.
_RECORD = (
    "import atexit, os, sys\n"
    "atexit.register(lambda: open(os.environ['TAKEN'], 'w').write(str('click' in sys.modules)))\n"
    "sys.argv[0] = 'gpusched'\n"
)
FAST = _RECORD + "from gpusched.cli import main\nmain()\n"
CLICK = _RECORD + "from gpusched.cli.group import cli\ncli(prog_name='gpusched')\n"

# Elapsed times ("5s", "2m", "1h3m") move between the two runs of a pair.
# A duration, with the padding before it: "     9s" and "    10s" are the same column.
_ELAPSED = re.compile(r" *\b\d+[smhd](\d+[smhd])*\b")


def _run(
    script: str, argv: list[str], env: dict[str, str], taken: Path
) -> tuple[int, str, str, bool]:
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        env={**env, "TAKEN": str(taken)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    clicked = taken.read_text() == "True"
    return done.returncode, done.stdout, done.stderr, clicked


def _agree(argv: list[str], env: dict[str, str], tmp: Path, *, fast: bool) -> None:
    """Both paths print the same; `fast`: the fast path answered without click."""
    for _attempt in range(3):  # a running job's figures may move between the two runs
        code, out, err, clicked = _run(FAST, argv, env, tmp / "fast")
        code2, out2, err2, _ = _run(CLICK, argv, env, tmp / "click")
        assert clicked is not fast, (argv, err)
        mine = (code, _ELAPSED.sub(" T", out), _ELAPSED.sub(" T", err))
        if mine == (code2, _ELAPSED.sub(" T", out2), _ELAPSED.sub(" T", err2)):
            return
    import difflib

    diff = "\n".join(difflib.unified_diff(out2.splitlines(), out.splitlines(), lineterm=""))
    assert (code, out, err) == (code2, out2, err2), f"{argv}: click, then fast\n{diff}"


# (command line, whether the fast path takes it): every form the fast path takes, and
# beside each the forms it must leave to click.
READING = [
    (["status"], True),
    (["status", "--all"], True),
    (["status", "--json"], True),
    (["status", "--json", "--all"], True),
    (["status", "--limit", "1"], True),
    (["status", "--limit=0", "--all"], True),
    (["status", "--all", "--limit", "1", "--json"], True),
    (["status", "--mine"], True),
    (["status", "--mine", "--all", "--json"], True),
    (["status", "--user", "root"], True),
    (["status", "--user=nobody", "--all"], True),
    (["show", "{ended}"], True),
    (["show", "{held}"], True),
    (["show", "--json", "{ended}"], True),
    (["show", "{notified}"], True),  # notify, after, priority: every row show draws
    (["show", "{notified}", "--json"], True),
    (["show", "{running}"], True),
    (["show", "--json", "{running}"], True),
    (["show", "999999"], True),  # unknown job id: the daemon's error, exit 1
    (["show", "0"], True),
    (["status", "--help"], False),
    (["status", "-h"], False),
    (["status", "--bogus"], False),  # unknown option
    (["status", "--limit"], False),  # missing value
    (["status", "--limit", "x"], False),
    (["status", "--limit", "-1"], False),
    (["status", "--json=1"], False),
    (["status", "{ended}"], False),  # ids: click's
    (["status", "--mine", "--user", "root"], False),  # both: click's refusal
    (["status", "--mine=1"], False),
    (["show"], False),
    (["show", "x"], False),
    (["show", "-1"], False),
    (["show", "1", "2"], False),
    (["show", "--help"], False),
    (["submit", "--help"], False),
    (["--help"], False),
    ([], False),
    (["statu"], False),
]

SUBMITTING_BADLY = [
    (["submit", "--mem", "12Q", "--", "true"], True),  # bad size
    (["submit", "--mem", "0", "--", "true"], True),
    (["submit", "--mem", "100M", "--", "true"], True),  # under the least a job may ask
    (["submit", "--mem", "1G", "--gpus", "0", "--", "true"], True),
    (["submit", "--mem", "1G", "--time", "soon", "--", "true"], True),
    (["submit", "--mem", "100G", "--", "true"], True),  # more than any GPU: the daemon says
    (["submit", "--mem", "1G", "--", "/no/such/program"], True),
    (["submit", "--mem", "1G", "--", ""], True),  # an empty program
    (["submit", "--mem", "1G", "--", "no-such-program-here"], True),
    (["submit", "--mem", "1G", "--", "."], True),  # a directory
    (["submit", "--mem", "1G", "--name", "n" * 201, "--", "true"], True),
    (["submit", "--mem=1G", "--time=0.5s", "--", "true"], True),  # too short
    (["submit", "--mem", "1G", "--time", "0", "--", "true"], True),
    (["submit", "--mem", "1G", "--gpus", "3", "--", "true"], True),  # more GPUs than there are
    (["submit", "--mem", "1G", "--gpus", "-1", "--", "true"], False),
    (["submit", "--mem", "1G", "--"], False),  # no command
    (["submit", "--mem", "--", "true"], False),  # --mem's value would be "--"
    (["submit", "--mem"], False),  # missing value
    (["submit", "--bogus", "--", "true"], False),
    (["submit", "--mem", "auto", "--", "true"], False),
    (["submit", "--gpus", "x", "--mem", "1G", "--", "true"], False),
]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    root = tmp_path_factory.mktemp("fast")
    # No poll during the tests: each poll adds a point to a running job's timeline, which
    # `show --json` prints, so the two paths' outputs, taken one after the other, would
    # differ whenever a poll fell between them. Submits still start a pass each.
    daemon = RunningDaemon(root, simulate="2x24G", config={"poll_interval": "1h"}).start()
    env = {k: v for k, v in daemon.env.items() if k != "GPUSCHED_CONFIG"}
    env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
    env["COLUMNS"] = "100"
    ended = daemon.submit("--mem", "1G", "--name", "ended\x1b[2J", "--", "true")
    daemon.wait_state(ended, {"done"})
    running = [daemon.submit("--mem", "20G", "--", "sleep", "600") for _ in range(2)]
    waiting = daemon.submit("--mem", "20G", "--", "sleep", "600")  # waits: both cards are taken
    # Settled before any test compares two paths' output: a job starting, or a reason
    # arriving, between the fast path's run and click's would make them differ.
    for job_id in running:
        daemon.wait_state(job_id, {"running"})
    daemon.wait_reason(waiting, "needs 20.0G")
    held = daemon.submit("--mem", "1G", "--hold", "--name", "h\u00e9ld \u4f5c\u696d", "--", "true")
    notified = daemon.submit(
        "--mem", "1G", "--hold", "--priority", "3", "--after", str(ended),
        "--notify", "echo 'job \x1b[2J done'", "--", "sh", "-c", "exit 0",
    )  # fmt: skip
    env["_ENDED"], env["_HELD"], env["_NOTIFIED"] = str(ended), str(held), str(notified)
    env["_RUNNING"] = str(ended + 1)
    yield daemon, env
    daemon.stop()
    daemon.kill_jobs()


def _filled(argv: list[str], env: dict[str, str]) -> list[str]:
    return [
        word.format(
            ended=env["_ENDED"],
            held=env["_HELD"],
            notified=env["_NOTIFIED"],
            running=env["_RUNNING"],
        )
        for word in argv
    ]


@pytest.mark.parametrize(("argv", "fast"), READING + SUBMITTING_BADLY)
def test_the_fast_path_and_click_agree(
    served: tuple[RunningDaemon, dict[str, str]], argv: list[str], fast: bool, tmp_path: Path
) -> None:
    _agree(_filled(argv, served[1]), served[1], tmp_path, fast=fast)


def test_the_global_socket_option_and_no_daemon(
    served: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    daemon, env = served
    socket = str(daemon.socket_path)
    elsewhere = {k: v for k, v in env.items() if k != "GPUSCHED_SOCKET"}
    elsewhere["GPUSCHED_SYSTEM_SOCKET"] = str(tmp_path / "no-system.sock")
    elsewhere["XDG_RUNTIME_DIR"] = str(tmp_path)
    _agree(["--socket", socket, "status"], elsewhere, tmp_path, fast=True)
    _agree([f"--socket={socket}", "status", "--json"], elsewhere, tmp_path, fast=True)
    _agree(["status", "--socket", socket], elsewhere, tmp_path, fast=False)
    gone = {**env, "GPUSCHED_SOCKET": str(tmp_path / "gone.sock")}
    for argv in (["status"], ["show", "1"], ["submit", "--mem", "1G", "--", "true"]):
        _agree(argv, gone, tmp_path, fast=True)  # exit 3, the same words
    # An ASCII stdout (PYTHONIOENCODING=ascii, a broken locale): click writes UTF-8 with
    # errors replaced, and so must the fast path, for output and errors alike.
    ascii_out = {**env, "PYTHONIOENCODING": "ascii"}
    _agree(["status"], ascii_out, tmp_path, fast=True)
    _agree(["show", env["_HELD"]], ascii_out, tmp_path, fast=True)
    _agree(["submit", "--mem", "1G", "--", "/no/pr\u00f3gram"], ascii_out, tmp_path, fast=True)
    with_config = {**env, "GPUSCHED_CONFIG": str(daemon.config_path)}
    _agree(["status"], with_config, tmp_path, fast=True)  # its socket: line, read plainly
    _agree(["status"], {**env, "GPUSCHED_CONFIG": str(tmp_path)}, tmp_path, fast=False)


def test_a_submit_queues_the_same_job_either_way(
    served: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    """A good submit: the same job from both paths (ids and times aside), as id and JSON."""
    env = served[1]
    argv = ["submit", "--mem", "2G", "--gpus", "1", "--name", "twin", "--time", "1h", "--hold"]
    results = [
        _run(script, [*argv, "--json", "--", "sh", "-c", "exit 0"], env, tmp_path / "t")
        for script in (FAST, CLICK)
    ]
    assert [r[0] for r in results] == [0, 0], results
    assert [r[3] for r in results] == [False, True]
    first, second = (json.loads(str(r[1])) for r in results)
    for key in ("id", "submitted_at"):
        first.pop(key), second.pop(key)
    assert first == second
    assert first["name"] == "twin" and first["state"] == "held" and first["time_limit_s"] == 3600
    ids = [_run(s, ["submit", "--hold", "--", "true"], env, tmp_path / "t") for s in (FAST, CLICK)]
    assert ids[0][0] == ids[1][0] == 0
    assert int(str(ids[1][1])) == int(str(ids[0][1])) + 1 and ids[0][2] == ids[1][2] == ""


GOOD_SUBMITS = [
    ["submit", "--mem", "1G", "--hold", "--json", "--", "true"],
    [
        "submit",
        "--mem=1536M",
        "--gpus=2",
        "--name=tw\u00efn \x1b",
        "--hold",
        "--json",
        "--",
        "true",
    ],
    ["submit", "--time", "90s", "--hold", "--json", "--", "sh", "-c", "echo {x} --mem 2G"],
    ["submit", "--hold", "--json", "--", "./no-such-script"],  # held: a warning, queued anyway
]


@pytest.mark.parametrize("argv", GOOD_SUBMITS)
def test_good_submits_agree(
    served: tuple[RunningDaemon, dict[str, str]], argv: list[str], tmp_path: Path
) -> None:
    """The same job from both paths (its id and time aside), the same warning."""
    env = served[1]
    results = [_run(script, argv, env, tmp_path / "t") for script in (FAST, CLICK)]
    assert [(r[0], r[3]) for r in results] == [(0, False), (0, True)], results
    assert results[0][2] == results[1][2]  # stderr: a warning, or nothing
    first, second = (json.loads(str(r[1])) for r in results)
    assert second["id"] == first["id"] + 1
    for key in ("id", "submitted_at"):
        first.pop(key), second.pop(key)
    assert first == second


def test_a_fast_submit_whose_answer_was_lost_is_retried_and_queued_once(
    served: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    """As Client.submit (tests/test_submit_idempotent.py): the fast path's submit sent again
    with the same request id after a lost answer queues one job, the one it prints."""
    from tests.test_submit_idempotent import DroppingRelay

    daemon, env = served
    printed: list[int] = []
    for script in (FAST, CLICK):
        relay = DroppingRelay(tmp_path / f"relay{len(printed)}.sock", daemon.socket_path)
        try:
            argv = ["--socket", str(relay.path), "submit", "--hold", "--name", "lost"]
            code, out, err, clicked = _run(script, [*argv, "--", "true"], env, tmp_path / "t")
        finally:
            relay.close()
        assert (code, err, relay.dropped, clicked) == (0, "", 1, script is CLICK)
        printed.append(int(out))
    lost = [j["id"] for j in daemon.status()["jobs"] if j["name"] == "lost"]
    assert lost == printed  # one job each, the one each was told


def test_status_reads_no_click_no_models_and_no_dataclasses(
    served: tuple[RunningDaemon, dict[str, str]],
) -> None:
    """What `gpusched status` costs at start: neither click, the models, nor the
    dataclasses module they need (the client is there, without them)."""
    script = (
        "import sys\nfrom gpusched.cli import main\nsys.argv = ['gpusched', 'status']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=served[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = set(eval(done.stderr.strip().splitlines()[-1]))  # noqa: S307 - our own repr
    assert "gpusched.client" in loaded
    assert not loaded & {"click", "gpusched.core.models", "dataclasses"}


@pytest.mark.parametrize("columns", [None, "120", "x", "0", "-5"])
def test_the_status_width_is_shutils(columns: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` reads its width without importing shutil: the same width."""
    import shutil

    from gpusched.cli.status_view import terminal_columns

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size((80, 24)).columns


def _connected(pid: int) -> bool:
    """Whether the process holds a connection to a daemon (its request is sent)."""
    import psutil

    try:
        return bool(psutil.Process(pid).net_connections(kind="unix"))
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    "argv", [["status"], ["show", "1"], ["submit", "--mem", "1G", "--", "true"]]
)
def test_ctrl_c_ends_a_blocked_command_quietly_with_130_on_both_paths(
    daemon_factory: Any, tmp_path: Path, argv: list[str]
) -> None:
    """Ctrl-C while the daemon does not answer (SIGSTOPped: the connection is accepted,
    the reply never comes) ends the command as it ends `wait`: nothing said, exit 130."""
    daemon = daemon_factory().start()
    env = {**daemon.env, "TAKEN": str(tmp_path / "taken")}
    assert daemon.process is not None
    ended = []
    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        for script in (FAST, CLICK):
            process = subprocess.Popen(
                [sys.executable, "-c", script, *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            eventually(functools.partial(_connected, process.pid), 30)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
            ended.append((process.returncode, out, err, (tmp_path / "taken").read_text()))
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    assert ended == [(130, "", "", "False"), (130, "", "", "True")]
