"""How `--help` reads: every command's help ends with its example.

Commands keep their example in the docstring, after a "\\b" line and "Example:"; click
prints a docstring before the options (and a group's before its command list), so these
classes move that section into the epilog, which click prints last.
"""

from __future__ import annotations

import inspect
from typing import Any

import click

_MARKER = "\b\nExample"


def _example_last(command: click.Command) -> None:
    help_text = inspect.cleandoc(command.help or "")
    if _MARKER in help_text and command.epilog is None:
        text, example = help_text.split(_MARKER, 1)
        command.help = text.rstrip()
        command.epilog = _MARKER + example


class ExampleLastCommand(click.Command):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _example_last(self)


class ExampleLastGroup(click.Group):
    command_class = ExampleLastCommand

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _example_last(self)
