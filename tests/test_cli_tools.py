"""The CLI with the tools people already use: shells, scripts (--json), terminals, --help."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpusched.cli import cli
from tests.daemon_harness import RunningDaemon, eventually, read_until_closed


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon (conftest.py `shared_daemon`): these tests read only their own jobs;
    completion offers recently ended ones too, so its tests take `fresh_daemon`."""
    return shared_daemon


JOB_FIELDS = {"id", "user", "state", "command", "mem", "gpus", "gpu_indices", "exit_code", "reason"}


def _gpusched_argv() -> list[str]:
    """The installed `gpusched` script next to this python, else `python -m gpusched`."""
    installed = Path(sys.executable).with_name("gpusched")
    if installed.exists():
        return [str(installed)]
    found = shutil.which("gpusched")
    return [found] if found else [sys.executable, "-m", "gpusched"]


# -- completion ---------------------------------------------------------------------------


def test_bash_completion_script_loads_and_completes_commands_and_options() -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    gpusched = " ".join(_gpusched_argv())
    loaded = subprocess.run(
        ["bash", "-c", f"source <({gpusched} completion bash) && complete -p gpusched"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "_gpusched_completion" in loaded.stdout
    assert loaded.stderr == ""
    # What the loaded function asks the program for, as bash would.
    assert _complete("gpusched sta") == ["status"]
    assert "--watch" in _complete("gpusched status --wa")


def _complete(words: str, socket_path: Path | str | None = None) -> list[str]:
    """The candidates gpusched offers bash for the last of `words`, as the loaded
    completion function asks for them."""
    env = {
        **os.environ,
        "_GPUSCHED_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    if socket_path is not None:
        env["GPUSCHED_SOCKET"] = str(socket_path)
    done = subprocess.run(
        _gpusched_argv(), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if line]


def test_job_ids_complete_from_the_daemon(fresh_daemon: RunningDaemon, tmp_path: Path) -> None:
    daemon = fresh_daemon
    running = daemon.submit("--mem", "1G", "--name", "train", "--", "sleep", "60")
    ended = daemon.submit("--mem", "1G", "--", "true")
    daemon.wait_state(ended, {"done"})
    daemon.wait_state(running, {"running"})
    # cancel offers active jobs; show (and logs, requeue) recently ended ones too.
    assert _complete("gpusched cancel ", daemon.socket_path) == [str(running)]
    assert sorted(_complete("gpusched show ", daemon.socket_path)) == sorted(
        [str(running), str(ended)]
    )
    assert _complete(f"gpusched wait {str(running)[:-1]}", daemon.socket_path) == [str(running)]
    # No daemon: no candidates, and nothing printed into the prompt.
    assert _complete("gpusched cancel ", tmp_path / "nobody.sock") == []


def test_job_ids_complete_in_order_and_arrays_complete_too(fresh_daemon: RunningDaemon) -> None:
    daemon = fresh_daemon
    ended = daemon.submit("--mem", "1G", "--", "true")
    daemon.wait_state(ended, {"done"})
    running = daemon.submit("--mem", "1G", "--", "sleep", "60")
    swept = daemon.cli("submit", "--hold", "--mem", "1G", "--sweep", "x=1,2", "--", "echo", "{x}")
    assert swept.returncode == 0, swept.stderr
    held = [int(i) for i in swept.stdout.split()]
    daemon.wait_state(running, {"running"})
    # status --all lists active jobs before ended ones: the ids must still come in order.
    assert _complete("gpusched show ", daemon.socket_path) == [
        str(i) for i in sorted([ended, running, *held])
    ]
    array = daemon.client().job(held[0]).array_id
    assert _complete("gpusched wait a", daemon.socket_path) == [f"a{array}"]
    assert f"a{array}" in _complete("gpusched cancel ", daemon.socket_path)
    assert f"a{array}" in _complete("gpusched hold ", daemon.socket_path)  # aN: its queued jobs
    assert not any(c.startswith("a") for c in _complete("gpusched show ", daemon.socket_path))


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("zsh", "#compdef gpusched"), ("fish", "complete --no-files --command gpusched")],
)
def test_zsh_and_fish_completion_scripts(shell: str, marker: str) -> None:
    result = CliRunner().invoke(cli, ["completion", shell])
    assert result.exit_code == 0
    assert marker in result.output
    assert "_GPUSCHED_COMPLETE" in result.output
    assert CliRunner().invoke(cli, ["completion", "tcsh"]).exit_code == 2


# -- --help ----------------------------------------------------------------------------------


def _all_commands() -> list[tuple[str, click.Command]]:
    commands: list[tuple[str, click.Command]] = [("", cli)]
    ctx = click.Context(cli)
    commands += [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]  # type: ignore[misc]
    return commands


@pytest.mark.parametrize(("name", "command"), _all_commands(), ids=lambda v: str(v) or "gpusched")
def test_every_commands_help_ends_with_an_example(name: str, command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*([name] if name else []), "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output, f"`gpusched {name} --help` has no example"
    # The example comes last: after the options (and, for gpusched itself, the commands).
    example = result.output.rsplit("Example:", 1)[1].splitlines()[1:]
    assert not any(line.startswith(("Options:", "Commands:")) for line in example)
    lines = [line for line in example if line.strip()]
    assert lines, f"`gpusched {name} --help`: the example is empty"
    assert all(line.startswith("  ") and "gpusched" in "".join(lines) for line in lines)


# -- --json on every command that prints data ----------------------------------------------


def test_hold_release_cancel_and_wait_print_jobs_as_json(daemon: RunningDaemon) -> None:
    blocker = daemon.submit("--", "sleep", "60")  # whole GPUs: the next two wait
    other = daemon.submit("--", "sleep", "60")
    daemon.wait_state(blocker, {"running"})
    daemon.wait_state(other, {"running"})
    queued = daemon.submit("--mem", "1G", "--", "true")

    def jobs(*args: str, code: int = 0) -> list[dict[str, object]]:
        result = daemon.cli(*args, "--json")
        assert result.returncode == code, result.stderr
        value = json.loads(result.stdout)
        assert isinstance(value, list)
        for job in value:
            assert set(job) >= JOB_FIELDS
        return value

    assert [j["state"] for j in jobs("hold", str(queued))] == ["held"]
    assert [j["state"] for j in jobs("release", str(queued))] == ["queued"]
    assert [j["id"] for j in jobs("cancel", str(blocker))] == [blocker]
    waited = jobs("wait", str(blocker), str(queued), "--timeout", "20", code=1)  # one cancelled
    assert [j["id"] for j in waited] == [blocker, queued]
    assert [j["state"] for j in waited] == ["cancelled", "done"]
    doctor = json.loads(daemon.cli("doctor", "--json").stdout)
    assert {"ok", "checks"} <= set(doctor)
    daemon.cli("cancel", str(other))


def test_priority_changes_many_jobs_and_arrays_in_one_request(daemon: RunningDaemon) -> None:
    first = daemon.submit("--hold", "--mem", "1G", "--", "true")
    second = daemon.submit("--hold", "--mem", "1G", "--", "true")
    swept = daemon.submit_jobs("--hold", "--mem", "1G", "--sweep", "x=1,2", "--", "echo", "{x}")
    array = daemon.client().job(swept[0]).array_id
    both = daemon.cli("priority", str(first), str(second), "7")
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == [f"job {first}: priority 7", f"job {second}: priority 7"]
    listed = daemon.cli("priority", f"{first},a{array}", "4", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["priority"]) for j in json.loads(listed.stdout)] == [
        (i, 4) for i in [first, *swept]
    ]
    one = daemon.cli("priority", str(second), "2", "--json")  # one id: one JOB, as always
    assert json.loads(one.stdout)["priority"] == 2
    # A job the caller cannot touch is refused on its own line; the others still change.
    missing = daemon.cli("priority", str(first), "999999", "3")
    assert missing.returncode == 1
    assert missing.stdout.splitlines() == [f"job {first}: priority 3"]
    assert len(missing.stderr.splitlines()) == 1 and "999999" in missing.stderr
    assert daemon.show(first)["priority"] == 3
    daemon.cli("cancel", str(first), str(second), f"a{array}")


# -- status on a terminal ------------------------------------------------------------------


def _run_on_a_pty(argv: list[str], env: dict[str, str]) -> str:
    """Run argv with stdout on a pseudo-terminal (isatty() is true there); its output."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(argv, stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    received = read_until_closed(leader)
    assert process.stderr is not None
    with process.stderr:
        errors = process.stderr.read()
    assert process.wait(timeout=30) == 0, errors
    return received.decode()


def test_status_is_coloured_on_a_terminal_unless_no_color(daemon: RunningDaemon) -> None:
    job = daemon.submit("--mem", "4G", "--", "sleep", "30")
    daemon.wait_state(job, {"running"})
    argv = [sys.executable, "-m", "gpusched", "status"]
    env = {**daemon.env, "COLUMNS": "80"}
    env.pop("NO_COLOR", None)
    coloured = _run_on_a_pty(argv, env)
    assert "\x1b[" in coloured
    plain = _run_on_a_pty(argv, {**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain
    # The same screen, coloured or not (times may tick between the two runs).
    assert [line.split()[:3] for line in click.unstyle(coloured).splitlines()] == [
        line.split()[:3] for line in plain.splitlines()
    ]
    piped = daemon.cli("status", env=env)
    assert "\x1b[" not in piped.stdout
    lines = piped.stdout.splitlines()
    assert lines[0].split() == ["GPU", "NAME", "MEMORY", "USED/TOTAL", "AVAILABLE", "UTIL"]
    assert any(line.startswith("running (1)") for line in lines)
    assert all(len(line) <= 80 for line in lines)


def test_status_at_80_columns_keeps_the_scripts_name(daemon: RunningDaemon, tmp_path: Path) -> None:
    """An ended job's label leaves its command less room: the cut takes the interpreter's
    name, never the script's (it said `failed exit 1: .../python3.11 .../...`)."""
    bin_dir = tmp_path / "envs" / "pytorch-2.3-cuda12" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3.11").symlink_to(sys.executable)
    script = tmp_path / "finetune_llama.py"
    script.write_text("raise SystemExit(1)\n")
    job = daemon.submit(
        "--mem", "1G", "--", str(bin_dir / "python3.11"), str(script), "--lr", "0.1"
    )
    daemon.wait_state(job, {"failed"})
    shown = daemon.cli("status", "--all", env={**daemon.env, "COLUMNS": "80"})
    [row] = [line for line in shown.stdout.splitlines() if line.split()[:2] == [str(job), "root"]]
    assert len(row) <= 80, row
    assert {".../finetune_llama.py", ".../finetune_llama.py+"} & set(row.split()), row


def test_status_watch_redraws_until_ctrl_c_and_exits_0(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpusched", "status", "--watch", "--interval", "0.2"],
            env=daemon.env,
            stdout=out,
            stderr=err,
        )
    try:
        eventually(
            lambda: out_path.read_text().count("every 0.2s: gpusched status") >= 3,
            20,
            describe=out_path.read_text,
        )
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    errors = err_path.read_text()
    assert "Traceback" not in errors and "Aborted" not in errors
    assert out_path.read_text().count("GPU NAME") >= 3
    assert daemon.cli("status", "--watch", "--json").returncode == 2


def test_status_stays_light_no_sqlalchemy_apscheduler_pynvml_or_prometheus(
    daemon: RunningDaemon,
) -> None:
    code = (
        "import sys\n"
        "from gpusched.cli import cli\n"
        "try:\n"
        "    cli(['status', '--all'], prog_name='gpusched')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "heavy = ('sqlalchemy', 'apscheduler', 'pynvml', 'prometheus_client', 'yaml')\n"
        "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    env = {**daemon.env, "GPUSCHED_SOCKET": str(daemon.socket_path)}
    env.pop("GPUSCHED_CONFIG")  # with a config file the client reads YAML; that is its price
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "GPU NAME" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []"
