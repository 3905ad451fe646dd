"""What the submitting process gives its job besides its options: its command resolved as
it would run it here (`train.py` through the python on its own PATH, so an activated venv
or conda env is honoured; a program that could never start is refused here, at submit),
its umask, and a `--notify` string split as a shell would split it (no shell ever runs
it). Client side: runs in the user's process, never the daemon's."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from gpusched.core.errors import UsageError


def resolve_command(command: Sequence[str], cwd: str, path_env: str | None) -> list[str]:
    """`train.py` that is not executable runs with the `python` on the submitter's PATH."""
    argv = list(command)
    if not argv:
        raise UsageError("no command given: gpusched submit [OPTIONS] -- COMMAND [ARGS...]")
    first = argv[0]
    if first.endswith(".py"):
        script = Path(cwd, first)
        if not (script.is_file() and os.access(script, os.X_OK)):
            python = shutil.which("python", path=path_env) or shutil.which("python3", path=path_env)
            if python is None:
                raise UsageError(f"cannot run {first}: no python or python3 on your PATH")
            argv.insert(0, python)
    return argv


def runnable_command(
    argv: list[str], cwd: str, path_env: str | None
) -> tuple[list[str], str | None]:
    """`argv` as the job will run it, and why it could never start (None: it can).

    The program is looked up as the job's own exec will look it up, here in the
    submitter's process with the submitter's PATH (the daemon never searches a user's PATH
    as root): a name with a slash is a path from `cwd`; any other name is searched on PATH,
    then in `cwd`, where an executable file runs as `./NAME` (the shell habit of running a
    script of the current directory by its name would otherwise end `failed_to_start`).
    """
    first = argv[0]
    if not first:
        return argv, None  # the request's own check says what an empty command lacks
    if "/" in first:
        return argv, _not_runnable(Path(cwd, first), first)
    if shutil.which(first, path=path_env) is not None:
        return argv, None
    here = Path(cwd, first)
    if here.is_file() and os.access(here, os.X_OK):
        return [f"./{first}", *argv[1:]], None
    if any(c.isspace() for c in first):
        return argv, (
            f"command not found: {first!r} is a command line in one string: use sh -c or"
            " split it (gpusched submit -- python train.py --lr 0.1)"
        )
    hint = _hint(first, here, path_env)
    return argv, f"command not found: {first} (not on your PATH, not in {cwd}){hint}"


def _not_runnable(path: Path, given: str) -> str | None:
    if not path.exists():
        return f"cannot run {given}: no such file"
    if path.is_dir():
        return f"cannot run {given}: it is a directory"
    if not os.access(path, os.X_OK):
        return (
            f"cannot run {given}: it is not executable"
            f" (chmod +x {given}, or name its interpreter first)"
        )
    return None


def _hint(first: str, here: Path, path_env: str | None) -> str:
    """What the user probably meant."""
    if shutil.which(f"{first}3", path=path_env) is not None:
        return f"; {first}3 is there: use {first}3 (Debian and Ubuntu have no plain `{first}`)"
    if here.is_file():
        return f"; ./{first} is not executable: chmod +x {first}, or name its interpreter first"
    return ""


def notify_argv(notify: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """`--notify 'notify-send "job done"'` -> ["notify-send", "job done"]; never a shell."""
    if notify is None:
        return None
    argv = shlex.split(notify) if isinstance(notify, str) else list(notify)
    if not argv or not argv[0]:
        raise UsageError("--notify: empty command")
    return tuple(argv)


def current_umask() -> int:
    """This process's umask, for its job's files (reading it means setting it: put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
