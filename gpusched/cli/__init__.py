"""The `gpusched` command line: the entry point, `main()`.

The commonest forms of `status`, `show` and `submit` are answered by cli/fast.py without
click; every other command line goes to the click group in cli/group.py (its commands,
error boundary and `--help`), loaded only then. `gpusched.cli.cli` is that group.

A thin client: every command except `daemon` is one or a few requests through
`gpusched.client.Client`. Errors become one line on stderr and the contract's exit
code (0 ok, 1 failed, 2 bad usage, 3 daemon unreachable, 124 wait timed out). None of the
command modules imports SQLAlchemy, APScheduler, pynvml, prometheus_client, YAML or psutil
at import time: `gpusched status` must start fast.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's own import costs every command
if TYPE_CHECKING:
    from gpusched.cli.group import cli, global_options

__all__ = ["cli", "global_options", "main"]


def main() -> None:
    from gpusched.cli.fast import answer

    code = answer(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from gpusched.cli.group import cli

    cli(prog_name="gpusched")


def __getattr__(name: str) -> object:
    """`gpusched.cli.cli` and `global_options`: the click group's, loaded when asked for."""
    if name in ("cli", "global_options"):
        from gpusched.cli import group

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
