"""A config file's `socket:` key read without the YAML parser, for a client that needs
nothing else from the file (every CLI command run as root reads /etc/gpusched/config.yaml
for it): a line scanner that understands only the plain form the shipped config uses,

    socket: /run/gpusched/gpusched.sock   # a comment

and answers None for anything fancier, so that the caller parses the file whole
(gpusched.config.settings.load_config) and says what YAML and the checks say. It reads
the file that parser would read, through the same bounded read (config/file_bytes.py),
and no other: no cache, nothing another user could have written in its place.

What the scanner does not do is check the file's other keys: a client that only looks for
its daemon's socket is not the judge of the daemon's settings (the daemon, `gpusched
doctor` and `gpusched admin reload` are).
"""

from __future__ import annotations

import os

from gpusched.config.file_bytes import read_config_bytes

TYPE_CHECKING = False  # typing's own import costs every client command
if TYPE_CHECKING:
    from pathlib import Path

# What may start a top-level line the scanner reads past: a key of letters, digits and _.
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# A plain path's characters that YAML could read as something else: quotes, flow
# collections, anchors, aliases, tags, block scalars, directives, a comment without space.
_FANCY = frozenset("'\"{}[]&*!|>%@`#,")


def socket_setting(path: Path, default: Path) -> Path | None:
    """The socket `path` names (`default` when it names none), or None: read it whole.

    Also None when the file cannot be read as UTF-8 or is over the size bound: the full
    reader says why in its words. The path comes out as `parse_path` makes it (absolute,
    `~` expanded); anything it would refuse is None, for its error to be said."""
    from gpusched.core.errors import ConfigError

    try:
        text = read_config_bytes(path).decode("utf-8").replace("\r\n", "\n")
    except (ConfigError, UnicodeDecodeError):
        return None
    scanned = _scan(text.split("\n"))
    if scanned is None:
        return None
    return default if scanned == "" else _absolute(scanned)


def _scan(lines: list[str]) -> str | None:
    """The top-level `socket:` value of these lines ("" for none), or None: they are more
    than top-level keys, comments and the mappings and lists under the keys."""
    found = ""
    in_socket = False  # lines after `socket:` until the next key: its value may go on
    for line in lines:
        if not line.replace("\t", " ").isprintable():
            return None  # YAML's other line breaks, control characters, a BOM
        if not line.strip(" ") or line.lstrip(" ").startswith("#"):
            continue
        if line[0] == " ":
            if in_socket:
                return None  # the value goes on over more lines: the parser joins them
            continue  # inside another key's mapping or list: not the socket's
        key, colon, rest = line.partition(":")
        if not colon or not key or not set(key) <= _KEY_CHARS or rest[:1] not in ("", " "):
            return None  # a list, a document marker, a flow mapping, a quoted key...
        in_socket = key == "socket"
        if in_socket:
            if found:
                return None  # given twice: the strict loader refuses it, in its words
            found = _plain_value(rest)
            if not found:
                return None
    return found


def _plain_value(rest: str) -> str:
    """The value after `socket:` as YAML reads a plain scalar, or "" where it might read
    it otherwise (none on this line: null, or a block on the next ones)."""
    value = rest.partition(" #")[0].strip(" ")
    if not value or set(value) & _FANCY or ": " in value or value.endswith(":"):
        return ""
    if "\t" in value or value[0] not in "/~" or value == "~":
        return ""  # null (~), a number, a relative path: the parser's checks say so
    return value


def _absolute(value: str) -> Path | None:
    from pathlib import Path

    try:
        path = Path(value).expanduser()
    except RuntimeError:
        return None  # `~user` with no such user: parse_path's error
    return path if os.path.isabs(path) else None
