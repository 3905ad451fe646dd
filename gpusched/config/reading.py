"""Reading a config file: its bytes off the disk, decoded and parsed into the mapping of
keys settings.py checks, every way a file can be wrong refused with one line.

The file is read whole through config/file_bytes.py's bounds, decoded as UTF-8
whatever the locale says (the same file must mean the same under every locale), and
parsed by a loader stricter than YAML's safe one: an anchor or alias is refused (an alias
bomb is a few lines that expand into gigabytes once something walks the value), and so is
a key written twice in one mapping (YAML keeps the last one silently: the first would be
a setting that does nothing).

Imported only when a file is read: a client finding its socket without one pays for no YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode

from gpusched.config.file_bytes import read_config_bytes
from gpusched.core.errors import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """What the strict loader refuses, with the line it is on (1-based)."""

    def __init__(self, problem: str, line: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line


def _line(mark: Mark | None) -> int:
    """The 1-based line a mark is on (0 where the parser gave none)."""
    return 0 if mark is None else mark.line + 1


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader without anchors, aliases and repeated keys."""

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()
        line = _line(event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"a YAML alias (*{event.anchor}) is not allowed in a config file", line)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(
                f"a YAML anchor (&{anchor}) is not allowed in a config file: write each value out",
                line,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue  # a list or mapping as a key: the safe loader's own error says so
            key = self.construct_object(key_node)
            if key in seen:
                raise _Refused(f"key {key!r} is given twice", _line(key_node.start_mark))
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_config_file(path: Path) -> dict[Any, Any]:
    """The mapping a config file holds ({} for an empty one), or ConfigError naming the
    file and, where there is one, the line or byte."""
    data = read_config_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not valid UTF-8 at byte {exc.start} (line {line}): save it as UTF-8"
        ) from None
    try:
        loaded = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader, stricter
    except _Refused as exc:
        raise ConfigError(f"{path}: line {exc.line}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return loaded
