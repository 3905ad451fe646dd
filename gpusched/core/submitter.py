"""What the submitting process gives its job besides its options: its command resolved as
it would run it here (`train.py` through the python on its own PATH, so an activated venv
or conda env is honoured), its umask, and a `--notify` string split as a shell would
split it (no shell ever runs it). Client side: runs in the user's process, never the
daemon's."""

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
