"""The `gpusched` click group: its error boundary, and the commands about gpusched itself
(daemon, doctor, completion). The entry point is `gpusched.cli.main`, which answers the
commonest forms of `status`, `show` and `submit` without click (cli/fast.py) and hands
every other argument list to this group.

A thin client: every command except `daemon` is one or a few requests through
`gpusched.client.Client`. Errors become one line on stderr and the contract's exit
code (0 ok, 1 failed, 2 bad usage, 3 daemon unreachable, 124 wait timed out).

`submit` lives in cli/submit.py, the other commands on jobs in cli/jobs.py, the views in
cli/views.py, `estimate` in cli/estimate.py, `run` in cli/run.py, the administrator's in
cli/admin.py; this module names them all for the group, which imports a command's module
only when that command is used (or listed by `--help`). None of them imports
SQLAlchemy, APScheduler, pynvml, prometheus_client, YAML or psutil at import time:
`gpusched status` must start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpusched.cli.help import ExampleLastGroup
from gpusched.core.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    GpuschedError,
    UsageError,
)

# Each command's module, imported only when that command runs (or `--help` lists them
# all): `gpusched status` loads the status command's module and what it needs, not
# submit's, run's or the administrator's.
_LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("gpusched.cli.submit", "submit"),
    "run": ("gpusched.cli.run", "run"),
    "status": ("gpusched.cli.views", "status"),
    "show": ("gpusched.cli.views", "show"),
    "logs": ("gpusched.cli.views", "logs"),
    "cancel": ("gpusched.cli.jobs", "cancel"),
    "hold": ("gpusched.cli.jobs", "hold"),
    "release": ("gpusched.cli.jobs", "release"),
    "wait": ("gpusched.cli.jobs", "wait"),
    "history": ("gpusched.cli.views", "history"),
    "priority": ("gpusched.cli.jobs", "priority"),
    "top": ("gpusched.cli.jobs", "top"),
    "requeue": ("gpusched.cli.jobs", "requeue"),
    "estimate": ("gpusched.cli.estimate", "estimate"),
    "drain": ("gpusched.cli.jobs", "drain"),
    "undrain": ("gpusched.cli.jobs", "undrain"),
    "admin": ("gpusched.cli.admin", "admin"),
    "kernel": ("gpusched.cli.kernel", "kernel"),
}


class _OneLineUsage(click.ClickException):
    """A usage error of click's (a missing argument, a value of the wrong type or out of
    its range), said as every other error is: one `gpusched: ...` line, exit 2."""

    exit_code = EXIT_USAGE

    def __init__(self, error: click.UsageError) -> None:
        ctx = error.ctx
        where = ctx.command_path if ctx is not None else "gpusched"
        text = error.format_message().rstrip(".")
        text = text[:1].lower() + text[1:]
        command = where.partition(" ")[2]
        said = f"{command}: {text}" if command else text
        super().__init__(f"{said}; see `{where} --help`")

    def show(self, file: Any = None) -> None:
        from gpusched.core.sanitize import shown

        click.echo(f"gpusched: {shown(self.message)}", err=True)


class _Group(ExampleLastGroup):
    """Turns every GpuschedError, and click's own usage errors, into one line on stderr
    and its exit code (Ctrl-C: nothing said, 130), and loads each command's module when
    the command is first asked for."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _OneLineUsage(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _LAZY_COMMANDS:
            module_name, attribute = _LAZY_COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module_name), attribute)
            self.add_command(global_options(command), cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a command's (or a subgroup's) parsing
            raise _OneLineUsage(exc) from None
        except GpuschedError as exc:
            from gpusched.core.sanitize import shown

            # The message may quote the user's input or a daemon's reply: shown escaped.
            click.echo(f"gpusched: {shown(exc.message)}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:  # Ctrl-C: quietly, 130, rather than click's "Aborted!"
            ctx.exit(EXIT_INTERRUPTED)


_CONFIG_HELP = "Config file (YAML). Env: GPUSCHED_CONFIG."
_SOCKET_HELP = "The daemon's Unix socket. Env: GPUSCHED_SOCKET."


def _given_after_the_command(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """`gpusched CMD --config PATH`: the same as `gpusched --config PATH CMD`, and it wins."""
    if value is None:
        return
    root = ctx.find_root()
    key = "config" if param.name == "config" else "socket"
    root.obj = {**(root.obj or {}), key: value}
    if key == "socket":
        root.obj["socket_from_env"] = False
    root.params[str(param.name)] = value  # where the job-id completer looks


def global_options(command: click.Command) -> click.Command:
    """Accept the group's --config and --socket after the command's name as well.

    Values go where the group's do (the root context), so every command reads them in
    one place (`ctx.find_root().obj`); the environment is read once, by the group.
    """
    command.params.extend(
        [
            click.Option(
                ["--config", "config"],
                type=click.Path(dir_okay=False),
                expose_value=False,
                callback=_given_after_the_command,
                help=_CONFIG_HELP,
            ),
            click.Option(
                ["--socket", "socket_path"],
                type=click.Path(),
                expose_value=False,
                callback=_given_after_the_command,
                help=_SOCKET_HELP,
            ),
        ]
    )
    return command


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config",
    envvar="GPUSCHED_CONFIG",
    type=click.Path(dir_okay=False),
    help=_CONFIG_HELP,
)
@click.option(
    "--socket",
    "socket_path",
    envvar="GPUSCHED_SOCKET",
    type=click.Path(),
    help=_SOCKET_HELP,
)
@click.version_option(package_name="gpusched")
@click.pass_context
def cli(ctx: click.Context, config: str | None, socket_path: str | None) -> None:
    """gpusched: queue GPU jobs by declared memory on a shared server.

    Each job declares the GPU memory it needs (--mem); the daemon starts it on the
    GPU with the most available memory, as the user who submitted it, with
    CUDA_VISIBLE_DEVICES set. Jobs share a card when they fit and never overcommit it.

    \b
    Example:
      gpusched daemon --simulate 2x24G --detach
      gpusched submit --mem 8G -- python train.py --lr 0.1
      gpusched status
    """
    from click.core import ParameterSource

    # A socket from $GPUSCHED_SOCKET is left for the client to read there itself: its
    # advice when nothing answers names the variable, not --socket.
    from_env = ctx.get_parameter_source("socket_path") == ParameterSource.ENVIRONMENT
    ctx.obj = {"config": config, "socket": socket_path, "socket_from_env": from_env}


@cli.command()
@click.option(
    "--simulate", metavar="SPEC", help="Simulated GPUs instead of NVML, e.g. 2x24G or 24G,16G."
)
@click.option(
    "--detach",
    is_flag=True,
    help="Run it in the background: return once it answers, printing its pid (exit"
    " non-zero, with its error, if it fails to start); its stderr goes to daemon.log"
    " in its state directory.",
)
@click.pass_context
def daemon(ctx: click.Context, simulate: str | None, detach: bool = False) -> None:
    """Run the scheduler daemon in the foreground (systemd runs this), or with
    --detach in the background, returning once it answers.

    Without root it serves only its own user, with the socket in $XDG_RUNTIME_DIR
    and the database and logs under ~/.local/state/gpusched. Where a system service
    serves the machine, a personal daemon needs --simulate or its own --socket.

    \b
    Example:
      gpusched daemon --simulate 2x24G --detach && gpusched status
      gpusched daemon --simulate 2x24G
    """
    from pathlib import Path

    from gpusched.daemon_socket import refuse_personal_daemon

    given = ctx.find_root().obj
    config = Path(given["config"]) if given.get("config") else None
    refuse_personal_daemon(config, simulate, given.get("socket"))
    if detach:
        from gpusched.cli.detach import start_detached

        ctx.exit(start_detached(given.get("config"), simulate, given.get("socket")))

    try:
        from gpusched.daemon.main import run_daemon
    except ImportError as exc:  # the client alone (the wheel in a user's own env)
        raise UsageError(
            f"the daemon's dependencies are not installed here (no module {exc.name!r}):"
            " pip install '/path/to/gpusched[daemon]' from a checkout (a server's service:"
            " sudo scripts/install.sh)"
        ) from None

    ctx.exit(run_daemon(config, simulate, given.get("socket")))


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, file names, job ids).

    \b
    Example:
      source <(gpusched completion bash)       # add to ~/.bashrc
      gpusched completion zsh > "${fpath[1]}/_gpusched"
      gpusched completion fish > ~/.config/fish/completions/gpusched.fish
    """
    from click.shell_completion import get_completion_class

    # click's own mechanism (_GPUSCHED_COMPLETE=bash_source gpusched), printed for the user.
    completer = get_completion_class(shell)
    if completer is None:  # click knows all three; guard against a future click
        raise UsageError(f"no completion for {shell}")
    click.echo(completer(cli, {}, "gpusched", "_GPUSCHED_COMPLETE").source())


@cli.command()
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": ..., "checks": [...]}.')
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check what usually goes wrong on a new server, with a fix for each problem:
    config valid, NVIDIA driver readable (NVML), jobs kept off the cards they were not
    given (cgroup v1's devices controller), daemon answering on its socket (and whose it
    is), state and log directories writable, systemd service active.
    Exits 1 if any check fails.

    \b
    Example:
      sudo gpusched doctor
    """
    from gpusched.cli.doctor import FAIL, render_checks, run_checks

    obj = ctx.find_root().obj or {}
    checks = run_checks(obj.get("config"), obj.get("socket"))
    failed = any(check.status == FAIL for check in checks)
    if as_json:
        from gpusched.cli.common import print_json

        print_json({"ok": not failed, "checks": [check.to_json() for check in checks]})
    else:
        from gpusched.cli.status_view import use_color

        click.echo(render_checks(checks, use_color()))
    ctx.exit(EXIT_FAILED if failed else EXIT_OK)


for _registered in cli.commands.values():  # this module's own; the others as they load
    global_options(_registered)
