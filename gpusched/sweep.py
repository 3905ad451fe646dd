"""Parameter sweeps: `--sweep lr=0.1,0.01 --sweep bs=32,64` -> one command per combination.

Each `{key}` in the command's arguments is replaced by the value; the cartesian product
of all keys' values gives the array's jobs, in the order the options were given (the
last key varies fastest). Pure functions: the client parses, the daemon expands.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from gpusched.errors import UsageError

MAX_ARRAY_JOBS = 10_000
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_sweep_option(text: str) -> tuple[str, list[str]]:
    """ "lr=0.1,0.01" -> ("lr", ["0.1", "0.01"])."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not _KEY_RE.match(key):
        raise UsageError(
            f"invalid --sweep {text!r}: expected NAME=VALUE,VALUE,... e.g. lr=0.1,0.01"
        )
    items = [v.strip() for v in values.split(",")]
    if not items or any(v == "" for v in items):
        raise UsageError(f"invalid --sweep {text!r}: empty value")
    return key, items


def expand(
    command: Sequence[str], sweep: Sequence[tuple[str, Sequence[str]]]
) -> list[tuple[list[str], str]]:
    """Every combination as (argv with placeholders filled, label such as "lr=0.1 bs=32")."""
    keys = [key for key, _ in sweep]
    if len(set(keys)) != len(keys):
        raise UsageError("--sweep names must be distinct")
    for key, values in sweep:
        if not _KEY_RE.match(key) or not values:
            raise UsageError(f"invalid --sweep {key!r}")
        if not any("{" + key + "}" in arg for arg in command):
            raise UsageError(f"--sweep {key}: the command has no {{{key}}} to fill in")
    total = 1
    for _, values in sweep:
        total *= len(values)
    if total > MAX_ARRAY_JOBS:
        raise UsageError(f"--sweep makes {total} jobs; one array holds at most {MAX_ARRAY_JOBS}")
    combos = []
    for values in itertools.product(*(values for _, values in sweep)):
        argv = list(command)
        for key, value in zip(keys, values, strict=True):
            argv = [arg.replace("{" + key + "}", value) for arg in argv]
        combos.append((argv, " ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))))
    return combos


def swept_name(name: str | None, label: str, limit: int) -> str:
    """A swept job's name: --name and its sweep values, within the names' `limit` (cut, not
    refused: the values are in the command too, which `show` prints)."""
    full = f"{name} {label}" if name else label
    return full if len(full) <= limit else full[: max(0, limit - 3)] + "..."
