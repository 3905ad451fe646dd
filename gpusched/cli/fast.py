"""The commonest command lines, answered without click, so that `gpusched status` and
the like answer at interpreter speed.

`answer(argv)` takes only the forms it understands in full and returns their exit code;
for anything else it returns None and cli/group.py's click group takes the command line,
as it would have without this module. Understood, and nothing more:

    [--socket PATH] status [--all] [--json] [--limit N] [--mine | --user NAME]
    [--socket PATH] show ID [--json]
    [--socket PATH] submit [--mem SIZE] [--gpus N] [--name NAME] [--time DURATION]
                           [--hold] [--json] -- COMMAND...

(each option also as --opt=VALUE; a value must not start with "-", N and ID are ASCII
digits). Any other word, `--help`, a missing value, `--config`, $GPUSCHED_CONFIG naming a
directory, a submit without `--`: click's. What a command sends and prints is the same
code the click command runs (cli/status_view.py through `Client.status_reply`,
show_view.py, submit_view.py, gpusched.submitter): neither click, the models nor any
dataclass is imported (tests/test_cli_imports.py); the show and submit frames are the
request classes' (tests/test_cli_fast_frames.py compares them). Errors end as the group
ends them (cli/group.py `_Group.invoke`): one line on stderr and the contract's exit code.
tests/test_cli_fast.py runs both on the same command lines and compares stdout, stderr
and the exit code.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's own import costs every command
if TYPE_CHECKING:
    from collections.abc import Callable

    Runner = Callable[[str | None, str | None], None]

# Each command's options: name -> whether it takes a value.
_STATUS_OPTIONS = {
    "--all": False,
    "--json": False,
    "--limit": True,
    "--mine": False,
    "--user": True,
}
_SHOW_OPTIONS = {"--json": False}
_SUBMIT_OPTIONS = {
    "--mem": True,
    "--gpus": True,
    "--name": True,
    "--time": True,
    "--hold": False,
    "--json": False,
}


def answer(argv: list[str]) -> int | None:
    """Run `gpusched ARGV` and return its exit code, or None: not a form understood here."""
    config_path = os.environ.get("GPUSCHED_CONFIG") or None
    if config_path and os.path.isdir(config_path):
        return None  # click's --config refuses a directory, in its words
    socket_path = None
    args = list(argv)
    if args and (args[0] == "--socket" or args[0].startswith("--socket=")):
        taken = _options(args[:2] if args[0] == "--socket" else args[:1], {"--socket": True})
        if taken is None:
            return None
        socket_path = taken[0]["--socket"]
        args = args[2:] if args[0] == "--socket" else args[1:]
    if not args:
        return None
    command = _COMMANDS.get(args[0])
    if command is None:
        return None
    runner = command(args[1:])
    if runner is None:
        return None
    return _run(runner, socket_path, config_path)


def _options(
    args: list[str], known: dict[str, bool]
) -> tuple[dict[str, str | bool], list[str]] | None:
    """The options among `args` and the other words, or None where click must judge."""
    given: dict[str, str | bool] = {}
    words: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        name, equals, value = word.partition("=")
        if not word.startswith("-") or word == "-":
            words.append(word)
        elif name not in known or (equals and not known[name]):
            return None  # unknown, -h, a flag given a value...
        elif not known[name]:
            given[name] = True
        else:
            if not equals:
                i += 1
                if i == len(args):
                    return None  # click says what is missing
                value = args[i]
            if not value or value.startswith("-"):
                return None
            given[name] = value
        i += 1
    return given, words


def _number(text: str | bool | None) -> int | None:
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else None


def _status(args: list[str]) -> Runner | None:
    parsed = _options(args, _STATUS_OPTIONS)
    if parsed is None or parsed[1]:
        return None
    given, _ = parsed
    limit = _number(given["--limit"]) if "--limit" in given else None
    if "--limit" in given and limit is None:
        return None
    as_json, show_all = "--json" in given, "--all" in given
    understood, user = _whose(given)
    if not understood:
        return None

    def run(socket_path: str | None, config_path: str | None) -> None:
        from gpusched.cli.status_view import fetch_status, status_json, status_text, use_color
        from gpusched.client import Client

        client = Client(socket_path, config_path)
        result = fetch_status(client, as_json=as_json, show_all=show_all, limit=limit, user=user)
        _echo(status_json(result) if as_json else status_text(result, show_all, use_color()))

    return run


def _whose(given: dict[str, str | bool]) -> tuple[bool, str | None]:
    """Whether the choice of user is understood here, and the user `--mine` or `--user
    NAME` names (None: everyone's jobs); click judges both given, or a uid with no name."""
    if "--mine" in given and "--user" in given:
        return False, None
    if "--mine" not in given:
        named = given.get("--user")
        return True, named if isinstance(named, str) else None
    import pwd  # built in, and only for --mine

    try:
        return True, pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return False, None


def _show(args: list[str]) -> Runner | None:
    parsed = _options(args, _SHOW_OPTIONS)
    if parsed is None or len(parsed[1]) != 1:
        return None
    job_id = _number(parsed[1][0])
    if job_id is None:
        return None
    as_json = "--json" in parsed[0]

    def run(socket_path: str | None, config_path: str | None) -> None:
        from gpusched.cli.show_view import show_json, show_lines, show_wire
        from gpusched.cli.status_view import terminal_columns
        from gpusched.connection import DaemonConnection

        reply = DaemonConnection(socket_path, config_path).request("show", **show_wire(job_id))
        if as_json:
            _echo(show_json(reply))
            return
        for line in show_lines(reply, terminal_columns()):
            _echo(line)

    return run


def _submit(args: list[str]) -> Runner | None:
    if "--" not in args:
        return None  # options after the command's first word: click's parser decides
    split = args.index("--")
    command = args[split + 1 :]
    parsed = _options(args[:split], _SUBMIT_OPTIONS)
    if parsed is None or parsed[1] or not command:
        return None
    given = parsed[0]
    gpus = _number(given["--gpus"]) if "--gpus" in given else 1
    if gpus is None or given.get("--mem") == "auto":
        return None
    text = {name: value for name, value in given.items() if isinstance(value, str)}

    def run(socket_path: str | None, config_path: str | None) -> None:
        from gpusched.cli.submit_view import job_options, submitted_text
        from gpusched.connection import DaemonConnection
        from gpusched.submitter import send_submit, submit_fields, submit_frame

        options = job_options(
            mem=text.get("--mem"),
            gpus=gpus,
            name=text.get("--name"),
            hold="--hold" in given,
            time_limit=text.get("--time"),
        )
        # What Client.submit does (its request built by gpusched.submitter, sent again
        # with the same id after a lost answer), with the request as a frame.
        connection = DaemonConnection(socket_path, config_path)
        frame = submit_frame(submit_fields(command, suggested_mem=_no_estimate, **options))
        reply = send_submit(
            lambda: connection.request("submit", **frame),
            frame["request_id"],
            connection.socket_path,
        )
        _echo(submitted_text(reply, "--json" in given))

    return run


def _no_estimate(argv: tuple[str, ...]) -> int:
    raise AssertionError("--mem auto is the click command's")  # answer() leaves it there


_COMMANDS = {"status": _status, "show": _show, "submit": _submit}


def _echo(text: str, err: bool = False) -> None:
    """As click.echo prints a line: to a stream whose encoding is ASCII (a misconfigured
    locale, PYTHONIOENCODING=ascii) as UTF-8 with errors replaced, as click does."""
    import codecs

    stream = sys.stderr if err else sys.stdout
    try:
        ascii_only = codecs.lookup(getattr(stream, "encoding", None) or "ascii").name == "ascii"
    except LookupError:
        ascii_only = False
    binary = getattr(stream, "buffer", None)
    if ascii_only and binary is not None:
        stream.flush()
        binary.write((text + "\n").encode("utf-8", "replace"))
        binary.flush()
        return
    stream.write(text + "\n")
    stream.flush()


def _run(runner: Runner, socket_path: str | bool | None, config_path: str | None) -> int:
    """The command's exit code, its errors ended as the click group ends them."""
    from gpusched.core.errors import EXIT_INTERRUPTED, GpuschedError

    try:
        runner(socket_path if isinstance(socket_path, str) else None, config_path)
    except GpuschedError as exc:
        from gpusched.core.sanitize import shown

        sys.stdout.flush()
        _echo(f"gpusched: {shown(exc.message)}", err=True)
        return exc.exit_code
    except BrokenPipeError:  # `gpusched status | head -1`: as click, quietly, exit 1
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the flush at exit goes nowhere
        return 1
    except KeyboardInterrupt:  # as the click group ends it: quietly
        return EXIT_INTERRUPTED
    except EOFError:
        _echo("\nAborted!", err=True)
        return 1
    return 0
