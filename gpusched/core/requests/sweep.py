"""Parameter sweeps: `--sweep lr=0.1,0.01 --sweep bs=32,64` -> one command per combination.

Each `{key}` in the command's arguments is replaced by the value; the cartesian product
of all keys' values gives the array's jobs, in the order the options were given (the
last key varies fastest). Pure functions: the client parses, the daemon measures, then
expands.

Substitution is one pass over the command as the user wrote it: a value that itself
contains `{other}` is left as it is. Replacing key after key would let one key's values
plant placeholders for the next, so that a few MiB of request expand to hundreds of GiB;
with one pass, `measure` gives the exact size of what `expand` would build, from the
request alone, before anything is built.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpusched.core.errors import UsageError

MAX_ARRAY_JOBS = 10_000  # the default of the `max_array_jobs` config key
# What one argument costs beyond its text, as the kernel counts argv against ARG_MAX (its
# NUL and its pointer): a command of many tiny arguments costs what it costs in memory.
ARG_OVERHEAD_BYTES = 9
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SweepSize:
    """What a sweep would create, computed without creating it."""

    jobs: int
    command_bytes: int  # every job's argv after substitution (UTF-8, plus ARG_OVERHEAD_BYTES)
    label_bytes: int  # every job's label ("lr=0.1 bs=32"), UTF-8
    longest_label: int  # characters of the longest label
    largest_command: int  # bytes of the largest job's argv, counted as command_bytes


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


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


def _placeholders(keys: Sequence[str]) -> re.Pattern[str]:
    if not keys:
        return re.compile(r"(?!)")  # an empty sweep: nothing to fill in (one job)
    return re.compile("|".join(re.escape("{" + key + "}") for key in keys))


def _check(command: Sequence[str], sweep: Sequence[tuple[str, Sequence[str]]]) -> None:
    keys = [key for key, _ in sweep]
    if len(set(keys)) != len(keys):
        raise UsageError("--sweep names must be distinct")
    for key, values in sweep:
        if not _KEY_RE.match(key) or not values:
            raise UsageError(f"invalid --sweep {key!r}")
        if not any("{" + key + "}" in arg for arg in command):
            raise UsageError(f"--sweep {key}: the command has no {{{key}}} to fill in")


def measure(command: Sequence[str], sweep: Sequence[tuple[str, Sequence[str]]]) -> SweepSize:
    """The size of `expand(command, sweep)`, in time linear in the request's size.

    Each key's value v appears in jobs/len(values) jobs; where the command holds the
    key's placeholder n times, each of those jobs carries n copies of v in place of
    n copies of "{key}".
    """
    _check(command, sweep)
    jobs = 1
    for _, values in sweep:
        jobs *= len(values)
    base = sum(_size(arg) + ARG_OVERHEAD_BYTES for arg in command)
    command_bytes = jobs * base
    pattern = _placeholders([key for key, _ in sweep])
    found: dict[str, int] = {}
    for arg in command:
        for match in pattern.findall(arg):
            found[match] = found.get(match, 0) + 1
    label_bytes = jobs * max(0, len(sweep) - 1)  # the spaces between "k=v" pairs
    longest = max(0, len(sweep) - 1)
    largest = base
    for key, values in sweep:
        share = jobs // len(values)  # how many jobs carry each one value
        value_bytes = sum(_size(v) for v in values)
        placeholder = _size("{" + key + "}")
        count = found.get("{" + key + "}", 0)
        command_bytes += count * share * (value_bytes - len(values) * placeholder)
        label_bytes += share * value_bytes + jobs * (_size(key) + 1)
        longest += len(key) + 1 + max(len(v) for v in values)
        largest += count * (max(_size(v) for v in values) - placeholder)
    return SweepSize(jobs, command_bytes, label_bytes, longest, largest)


def _filler(chosen: dict[str, str]) -> Callable[[re.Match[str]], str]:
    return lambda match: chosen[match.group(0)]


def expand(
    command: Sequence[str],
    sweep: Sequence[tuple[str, Sequence[str]]],
    max_jobs: int = MAX_ARRAY_JOBS,
) -> list[tuple[list[str], str]]:
    """Every combination as (argv with placeholders filled, label such as "lr=0.1 bs=32").

    Callers that take the request from a user check `measure()` against their limits first.
    """
    total = measure(command, sweep).jobs
    if total > max_jobs:
        raise UsageError(
            f"--sweep makes {total} jobs; one array holds at most {max_jobs} (max_array_jobs)"
        )
    keys = [key for key, _ in sweep]
    pattern = _placeholders(keys)
    combos = []
    for values in itertools.product(*(values for _, values in sweep)):
        chosen = {"{" + key + "}": value for key, value in zip(keys, values, strict=True)}
        argv = [pattern.sub(_filler(chosen), arg) for arg in command]
        combos.append((argv, " ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))))
    return combos


def swept_name(name: str | None, label: str, limit: int) -> str:
    """A swept job's name: --name and its sweep values, within the names' `limit` (cut, not
    refused: the values are in the command too, which `show` prints)."""
    full = f"{name} {label}" if name else label
    return full if len(full) <= limit else full[: max(0, limit - 3)] + "..."
