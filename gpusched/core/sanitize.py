"""Strings from users, made safe for people's eyes: the one sanitizer every display uses.

A job's name, command, working directory, a drain reason, an error quoting user input:
any of them may hold control characters, and a terminal *interprets* those (ESC [ 2 J
clears root's screen, ESC ] 0 ; sets its title, CR or a newline forges a row of `status`
or a line of the daemon's log; U+202E turns the rest of a line backwards). `shown()`
writes each such character as a visible escape instead (ESC as \\x1b, a newline as \\n,
U+202E as \\u202e), never interpreted, in plain ASCII so it survives any locale.

What is escaped: Unicode categories Cc (C0, DEL and C1, including the 8-bit CSI \\x9b),
Cf (format characters: bidi embeddings, overrides and isolates, zero-width joiners, the
BOM, tag characters), Zl and Zp (line and paragraph separators), Cs (lone surrogates: the
undecodable bytes of an argv) and Cn (unassigned: a later Unicode may make them format
characters). Backslashes are left as they are, so ordinary text reads unchanged: the
escapes are for reading, not for decoding back (strings without a backslash map one to
one). Printable text (letters of every script, emoji, combining marks) passes unchanged.

Used by the CLI (render.py, the commands' output, the one-line errors), by the daemon's
log (`quoted`, and the log formatter as a safety net) and by `gpusched logs` when one
user's output would reach another user's terminal (`shown_output`). Only the standard
library, imported lazily: the CLI imports this module at every start.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import costs every client command its start-up
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
# What shown_output() keeps in a job's output besides its lines: indentation.
_OUTPUT_KEPT = frozenset("\t")

_FIELD_NAMES: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}
# Annotations of fields that cannot hold a user's text (a JobState is checked when read).
_NOT_TEXT = frozenset(
    {"int", "int | None", "float", "float | None", "bool", "bool | None", "JobState"}
)
_NOT_TEXT_LISTS = frozenset({"list[int]", "list[float]"})


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escaped(char: str) -> bool:
    import unicodedata  # only when the fast path fails: a C module, cheap

    return unicodedata.category(char) in _ESCAPED_CATEGORIES


def shown(text: object) -> str:
    """`text` as a person may see it: every control or format character a visible escape.

    The result is one line (no newline, CR or separator survives) and holds no character a
    terminal would interpret; its length is the columns it takes for all but wide (East
    Asian) characters, so column widths are computed on it.
    """
    value = text if isinstance(text, str) else str(text)
    # str.isprintable() is False for every category escaped here (and for a few kept
    # ones, such as a no-break space): C speed for the common, clean case.
    if value.isprintable():
        return value
    return "".join(_escape(c) if _escaped(c) else c for c in value)


def shown_output(text: str) -> str:
    """A program's output for another person's terminal: lines and tabs kept, every other
    control character (ESC, CR, backspace, bidi overrides...) shown escaped."""
    return "\n".join(
        line
        if line.isprintable()
        else "".join(_escape(c) if c not in _OUTPUT_KEPT and _escaped(c) else c for c in line)
        for line in text.split("\n")
    )


def quoted(text: object, limit: int = 200) -> str:
    """A user's string in the daemon's log: shown(), cut to `limit` characters, in double
    quotes, so where it starts and ends is plain and it can never start a log line."""
    value = shown(text)
    if len(value) > limit:
        value = value[: max(0, limit - 3)] + "..."
    return f'"{value}"'


def shown_fields(value: T) -> T:
    """A copy of a dataclass (a Job, a GpuReport, a Drain) with every text field, and every
    text in a list field, passed through shown(): what a view draws from. The value itself
    when nothing needs escaping (the common case: `status` draws thousands of jobs)."""
    # Not dataclasses.is_dataclass: `gpusched status` draws from plain views of its reply
    # (escaped as they were made) and must not import dataclasses to learn so.
    if not hasattr(type(value), "__dataclass_fields__"):
        return value
    import dataclasses

    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    texts, lists = _text_fields(type(value))
    changes: dict[str, Any] = {}
    for name in texts:
        current = getattr(value, name)
        if isinstance(current, str) and not current.isprintable():
            changes[name] = shown(current)
    for name in lists:
        current = getattr(value, name)
        if isinstance(current, list) and current and not _printable(current):
            changes[name] = [shown(item) if isinstance(item, str) else item for item in current]
    return dataclasses.replace(value, **changes) if changes else value


def _printable(items: list[Any]) -> bool:
    try:
        return "".join(items).isprintable()  # one C call for the whole list
    except TypeError:  # not all text
        return all(not isinstance(item, str) or item.isprintable() for item in items)


def _text_fields(kind: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of `kind`'s fields that may hold text, and of those that hold lists,
    from their annotations (cached per class: this runs for every job `status` draws).
    A field annotated with anything but plain numbers, booleans or a str enum is kept."""
    known = _FIELD_NAMES.get(kind)
    if known is None:
        import dataclasses

        texts, lists = [], []
        for field in dataclasses.fields(kind):
            annotation = str(field.type)
            if annotation.startswith("list"):
                if annotation not in _NOT_TEXT_LISTS:
                    lists.append(field.name)
            elif annotation not in _NOT_TEXT:
                texts.append(field.name)
        known = _FIELD_NAMES[kind] = (tuple(texts), tuple(lists))
    return known


def command_for_log(argv: list[str], show_commands: bool) -> str:
    """What the daemon log says of a job's command. With `show_commands` off (other users
    may not see command lines, and the log is read by more people than root: the journal's
    readers) only the program's base name, which names the tool but none of its arguments
    (where tokens and paths go); with it on, the command line. Both quoted and cut short."""
    if not argv:
        return 'program ""'
    if show_commands:
        return "command " + quoted(" ".join(argv), 500)
    return "program " + quoted(argv[0].rsplit("/", 1)[-1], 60)
