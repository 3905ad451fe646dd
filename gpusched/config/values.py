"""Parsers of the config values that are more than a size or a duration.

Each takes the value as YAML gave it and returns what `Config` stores, or raises
UsageError with a one-line problem; settings.py, whose table of keys names the parser of
each, adds the file and key to the message. Sizes and durations themselves are parsed
by `units`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.units import parse_duration, parse_simulate_spec, parse_size


def parse_path(value: Any) -> Path:
    """`socket`, `state_dir`, `log_dir`: an absolute path, `~` and `~user` expanded.

    A string only: YAML's other values have a str() (a list once made a directory named
    "['a', 'b']"). Absolute only: the daemon's working directory is wherever it was started
    (/ under systemd), so a relative path would name a different file from one start to
    the next, and not the one a client given the same config would look for.
    """
    if not isinstance(value, str) or "\0" in value:
        raise UsageError(f"expected an absolute path, not {value!r}")
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # `~user` with no such user, or `~` with no home to find
        raise UsageError(f"cannot expand {value!r}: no such home directory") from None
    if not path.is_absolute():
        raise UsageError(
            f"expected an absolute path, not {value!r} (a relative one would depend on the"
            " daemon's working directory)"
        )
    return path


_SQLITE_EXAMPLE = "sqlite:////var/lib/gpusched/gpusched.db"
_POSTGRESQL_DRIVER = "postgresql+psycopg"  # psycopg 3: what `gpusched[postgres]` installs


def parse_database_url(value: Any) -> str:
    """`database`: an SQLite file (sqlite:////ABSOLUTE/PATH) or a PostgreSQL server
    (postgresql+psycopg://...), the two databases the store is written and tested for;
    SQLAlchemy checks the rest of a PostgreSQL URL when the daemon connects.

    The SQLite file is named by an absolute path alone: the store makes its directory
    and the file itself private from what follows sqlite:///, so a relative path would
    depend on the daemon's working directory, and ?options would name another file.
    """
    if not isinstance(value, str) or "://" not in value:
        raise UsageError(f"expected an SQLAlchemy URL such as {_SQLITE_EXAMPLE}, not {value!r}")
    scheme, _, rest = value.partition("://")
    if scheme == "sqlite":
        file = rest.removeprefix("/")
        if not rest.startswith("/") or not file.startswith("/") or "\0" in file:
            raise UsageError(
                f"expected sqlite:/// and an absolute path (four slashes: {_SQLITE_EXAMPLE})"
            )
        if "?" in file:
            raise UsageError(f"expected sqlite:/// and a path with no ?options: {_SQLITE_EXAMPLE}")
        return value
    if scheme == "postgresql":
        raise UsageError(
            f"write {_POSTGRESQL_DRIVER}://... (psycopg 3, the driver gpusched installs)"
        )
    if scheme != _POSTGRESQL_DRIVER:
        raise UsageError(
            f"expected an SQLite ({_SQLITE_EXAMPLE}) or PostgreSQL"
            f" ({_POSTGRESQL_DRIVER}://USER@HOST/DB) URL, not a {scheme} one"
        )
    return value


def parse_size_or_zero(value: Any) -> int:
    """A size, or 0 (which `parse_size` refuses: a size there is more than zero)."""
    if value in (0, "0"):
        return 0
    return parse_size(value)


def parse_duration_or_zero(value: Any) -> float:
    """A duration, or 0 (which `parse_duration` refuses)."""
    if value in (0, "0"):
        return 0.0
    return parse_duration(value)


def parse_gpus(value: Any) -> tuple[int | str, ...] | None:
    """`gpus`: 'all' / null (None), or one GPU index or UUID, or a list of them."""
    if value in (None, "all"):
        return None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, int | str) and not isinstance(i, bool) for i in items):
        raise UsageError("expected 'all' or a list of GPU indices or UUIDs")
    return tuple(items)


def parse_simulate(value: Any) -> str | None:
    """`simulate`: a fake GPU spec such as 2x24G (checked here, parsed by the daemon)."""
    if value is None:
        return None
    parse_simulate_spec(str(value))
    return str(value)


def parse_simulate_util(value: Any) -> int:
    """`simulate_util`: how busy a simulated job keeps its card, a whole percentage from
    0 to 100 ("95%" or 95)."""
    text = str(value).strip().removesuffix("%").strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) > 100:
        raise UsageError(f"expected a whole percentage from 0% to 100%, not {value!r}")
    return int(text)


def parse_positive_or_null(value: Any) -> int | None:
    """`max_jobs_per_gpu`: a whole number >= 1, or null (no limit)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError("expected a positive integer or null")
    return value


def one_of(first: str, second: str) -> Callable[[Any], str]:
    """A parser that accepts only `first` or `second` (a key with two settings)."""

    def parse(value: Any) -> str:
        if value not in (first, second):
            raise UsageError(f"expected {first!r} or {second!r}")
        return value

    return parse


def parse_bool(value: Any) -> bool:
    """`show_commands`: true or false, nothing YAML would merely make truthy."""
    if not isinstance(value, bool):
        raise UsageError("expected true or false")
    return value


def parse_admins(value: Any) -> tuple[str, ...]:
    """`admins`: user names and @groups (null or empty: none)."""
    items = value or []
    if not isinstance(items, list) or not all(isinstance(i, str) and i.strip("@") for i in items):
        raise UsageError("expected a list of user names and @groups")
    return tuple(items)


def parse_margin(value: Any) -> dict[str, Any]:
    """`overrun_margin`: a percentage of the declared memory ("10%") or a size ("1G"), or 0."""
    if value in (0, "0", None):
        return {"overrun_margin_fraction": 0.0, "overrun_margin_bytes": 0}
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise UsageError(
                f"expected a percentage such as 10% or a size such as 1G, not {value!r}"
            ) from None
        if not 0 <= percent <= 1000:
            raise UsageError("expected a percentage between 0% and 1000%")
        return {"overrun_margin_fraction": percent / 100, "overrun_margin_bytes": 0}
    return {"overrun_margin_fraction": 0.0, "overrun_margin_bytes": parse_size(value)}


# Below this, the cut log's head, marker and tail (gpusched.processes.logcap) would not
# fit sensibly.
MIN_LOG_CAP_BYTES = 64 * 1024


def parse_hook_count(value: Any) -> int:
    """`hooks_per_user`, `hooks_total`: a whole number >= 1 (`hook_output_max` is a size)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"expected a whole number >= 1, not {value!r}")
    return value


def parse_log_cap(value: Any) -> int | None:
    """`max_log_size`: a size of at least 64K, or 0 / null for no cap."""
    if value in (0, "0", None):
        return None
    size = parse_size(value)
    if size < MIN_LOG_CAP_BYTES:
        raise UsageError("expected a size of at least 64K, or 0 for no cap")
    return size


def parse_command(value: Any) -> tuple[str, ...] | None:
    """A hook command: a list of strings, or one string split as a shell would split it
    (shlex; never run by a shell: write `sh -c '...'` to get one)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        import shlex

        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise UsageError(f"cannot split {value!r} into arguments: {exc}") from None
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        argv = list(value)
    else:
        raise UsageError("expected a command: a string or a list of strings")
    if not argv or not argv[0]:
        raise UsageError("expected a command, got an empty one")
    return tuple(argv)


def parse_bound(value: Any, kind: str) -> int:
    """A request bound: a whole number ("count") or a size ("size", e.g. 16M), at least 1."""
    if kind == "size" and isinstance(value, str):
        number = parse_size(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise UsageError(f"expected {'a size such as 16M' if kind == 'size' else 'a whole number'}")
    if number < 1:
        raise UsageError("expected at least 1 (a bound cannot be switched off)")
    return number


def parse_count_bound(value: Any) -> int:
    """A request bound that counts (jobs): a whole number, at least 1."""
    return parse_bound(value, "count")


def parse_size_bound(value: Any) -> int:
    """A request bound in bytes: a size or a whole number, at least 1."""
    return parse_bound(value, "size")


def parse_percent(value: Any) -> float | None:
    """ "90%", 90 or 90.5 -> 90.0; null -> None (off). Between 1 and 100."""
    if value is None:
        return None
    text = str(value).strip().removesuffix("%").strip()
    try:
        percent = float(text)
    except ValueError:
        percent = math.nan
    if isinstance(value, bool) or not 1 <= percent <= 100:
        raise UsageError(f"expected a percentage from 1% to 100%, or null, not {value!r}")
    return percent


def parse_address(value: Any, example: str = "127.0.0.1:9400") -> tuple[str, int] | None:
    """ "127.0.0.1:9400", "[::1]:9400", ":9400" (all interfaces) or 9400 (localhost).

    The host must be an IP address or a host name: a typo such as "127.0.0.1.8080" or
    "localhost:80 80" is refused here, in the config's words, not at bind time.
    """
    if value is None or value is False:
        return None
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    bracketed = host.startswith("[") and host.endswith("]")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - only when the admin wrote ":PORT"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"expected HOST:PORT such as {example}, not {value!r}")
    if not _is_ip(host) and (bracketed or not _HOST_NAME.fullmatch(host)):
        raise UsageError(
            f"{host!r} is neither an IP address nor a host name (expected HOST:PORT"
            f" such as {example})"
        )
    return host, int(port)


def parse_web_address(value: Any) -> tuple[str, int] | None:
    """`web`: the dashboard's address, as `parse_address` (its example, port 8080)."""
    return parse_address(value, "127.0.0.1:8080")


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def parse_node_name(value: Any) -> str:
    """A node's name in a shared database: letters, digits, '.', '_', '-' (a host name)."""
    text = "" if value is None or isinstance(value, bool) else str(value).strip()
    if not _NODE_NAME.fullmatch(text):
        raise UsageError(
            "expected a name of letters, digits, '.', '_' or '-' (up to 63), such as gpu1"
        )
    return text


def parse_node_timeout(value: Any) -> float:
    """How long a node may go unheard before it is down: at least 3 s (a few polls)."""
    seconds = parse_duration(value)
    if seconds < 3:
        raise UsageError(f"expected at least 3s, not {value!r}")
    return seconds


# RFC 1123 labels; an all-digit dotted name (a mistyped IPv4 address) is refused below.
_HOST_NAME = re.compile(
    r"(?=.*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_ip(value: Any) -> str | None:
    """`metrics_scraper:` an IP address (written as the listener sees it), or null."""
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(str(value).strip()))
    except ValueError:
        raise UsageError(f"expected an IP address such as 10.0.0.5, not {value!r}") from None
