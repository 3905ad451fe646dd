"""Human sizes and durations: "8G" <-> bytes, "2s"/"1h30m" <-> seconds, both ways.

Every size or duration gpusched shows people is formatted here (`format_size`,
`format_duration`), so the CLI, the daemon's messages and the supervisor's agree; the
supervisor imports this, so it stays standard library only.

Sizes are binary (1G = 1Gi = 1GiB = 2**30 bytes), as GPU memory is reported by NVML and
nvidia-smi, and need a unit when written as text. Every size and duration a person types
(CLI, Python client, config file) goes through `parse_size` / `parse_duration` (and, for a
job, `parse_job_mem` / `parse_job_time`), so each is refused the same way in one line.
"""

from __future__ import annotations

import math
import re

from gpusched.core.errors import ConfigError, UsageError

TYPE_CHECKING = False  # typing's own import costs every client command
if TYPE_CHECKING:
    from decimal import Decimal

_SIZE_UNIT = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# A number (digits, a fraction, an exponent of at most three digits so that no text can make
# the arithmetic overflow), then a unit: K, M, G or T, each also written Ki/KiB/KB and the
# like (all binary), or B for bytes.
_SIZE_RE = re.compile(
    r"^\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)"
    r"\s*(?:([KMGT])(?:IB|I|B)?|(B))?\s*$",
    re.IGNORECASE,
)
_DURATION_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
# Far above any GPU's memory or any file gpusched bounds; past it a number is a typo.
MAX_SIZE_BYTES = 2**50
# The least a job may declare: a CUDA context alone takes a few hundred MB per process
# (FIELD.md: ~0.5 GiB for PyTorch), so a smaller --mem reserves nothing real.
MIN_JOB_MEM_BYTES = 256 * 2**20
# The least host memory a job may declare (`--ram`): an interpreter and its libraries
# alone take tens of MB, and a cgroup capped below that kills the job as it starts.
MIN_JOB_RAM_BYTES = 64 * 2**20


_TOO_LARGE = "too large (at most 1024T)"


def _shown(text: object) -> str:
    """A user's value in a message: whole when short, its start and length when not."""
    shown = str(text).strip()
    return shown if len(shown) <= 24 else f"{shown[:12]}... ({len(shown)} characters)"


def _size_error(what: str | None, text: object, problem: str) -> UsageError:
    if what:
        return UsageError(f"{what} {_shown(text)}: {problem}")
    return UsageError(f"invalid size {_shown(text)!r}: {problem}")


def parse_size(text: str | int, *, what: str | None = None) -> int:
    """Parse "8G", "8Gi", "8GiB", "512M", "1.5T", "1e3M" or "100B" into bytes (> 0).

    Every unit is binary (G = Gi = GiB = 2**30), as NVML and nvidia-smi count GPU memory.
    Text without a unit is refused ("8" is more likely 8G than 8 bytes); an int is bytes.
    `what` names the option or key in the one-line error ("--mem 8: add a unit, e.g. 8G").
    """
    if isinstance(text, bool) or not isinstance(text, int | str):
        if isinstance(text, float) and math.isfinite(text) and not isinstance(text, bool):
            value = int(text)  # YAML can hand us a float: bytes, as an int would be
        else:
            raise _size_error(what, text, "expected a size such as 8G or 512M")
    elif isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if not match:
            raise _size_error(what, text, "expected a number and a unit K, M, G or T, e.g. 8G")
        number, unit, byte_unit = match.groups()
        if number.isdigit():  # "8G": exact as an int, without importing decimal
            amount: int | Decimal = int(number)
        else:
            from decimal import Decimal  # parsing only: `status` formats sizes

            amount = Decimal(number)
        if amount == 0:
            raise _size_error(what, text, "must be more than zero")
        if unit is None and byte_unit is None:
            example = f"{number}G" if len(number) <= 12 else "8G"
            raise _size_error(what, text, f"add a unit, e.g. {example}")
        scaled = amount * _SIZE_UNIT[(unit or "").upper()]
        if scaled > MAX_SIZE_BYTES:
            raise _size_error(what, text, _TOO_LARGE)
        value = int(scaled)
    if value <= 0:
        raise _size_error(what, text, "must be more than zero")
    if value > MAX_SIZE_BYTES:
        raise _size_error(what, text, _TOO_LARGE)
    return value


def parse_job_mem(text: str | int, *, what: str = "--mem") -> int:
    """A job's declared memory per GPU: `parse_size`, and at least MIN_JOB_MEM_BYTES."""
    value = parse_size(text, what=what)
    if value < MIN_JOB_MEM_BYTES:
        raise UsageError(
            f"{what} {_shown(text)}: at least {format_size(MIN_JOB_MEM_BYTES, tabular=False)}"
            " (a CUDA context alone takes a few hundred MB)"
        )
    return value


def parse_job_ram(text: str | int, *, what: str = "--ram") -> int:
    """A job's host memory (`--ram`): `parse_size`, and at least MIN_JOB_RAM_BYTES."""
    value = parse_size(text, what=what)
    if value < MIN_JOB_RAM_BYTES:
        raise UsageError(
            f"{what} {_shown(text)}: at least {format_size(MIN_JOB_RAM_BYTES, tabular=False)}"
            " (an interpreter alone takes tens of MB)"
        )
    return value


def format_size(n_bytes: int | None, *, tabular: bool = True) -> str:
    """Bytes for people, in the binary units `parse_size` reads; None -> "-".

    In a table (the default) one decimal always, so a column lines up: 10737418240 ->
    "10.0G", 512 -> "512B". In a sentence (`tabular=False`) as people write sizes, the
    decimal only when it says something: "10G", "6.1G", "768M".
    """
    if n_bytes is None:
        return "-"
    value = float(n_bytes)
    for suffix in ("B", "K", "M", "G", "T"):
        # Compare after rounding, so 1023.96K shows as 1.0M rather than 1024.0K.
        if suffix == "B" and abs(value) < 1024:
            return f"{value:.0f}B"
        if suffix == "T" or abs(round(value, 1)) < 1024:
            text = f"{value:.1f}"
            if not tabular:
                text = text.removesuffix(".0")
            return text + suffix
        value /= 1024
    raise AssertionError("unreachable: T takes any size")


# The shortest duration anything in gpusched can act on (ms is the smallest unit), the
# shortest job time limit (its supervisor checks it about once a second), and the longest
# duration, exclusive (about 31 years: longer is a typo, and far longer overflows a timer).
MIN_DURATION_S = 0.001
MIN_JOB_TIME_S = 1.0
MAX_DURATION_S = 1e9


def _duration_error(what: str | None, text: object, problem: str) -> UsageError:
    if what:
        return UsageError(f"{what} {_shown(text)}: {problem}")
    return UsageError(f"invalid duration {_shown(text)!r}: {problem}")


def parse_duration(
    text: str | int | float, *, what: str | None = None, minimum_s: float = MIN_DURATION_S
) -> float:
    """Parse "2s", "500ms", "1h30m", or a bare number of seconds into seconds.

    At least `minimum_s` (1 ms unless the caller asks more), at most MAX_DURATION_S.
    """
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise _duration_error(what, text, "expected e.g. 2s, 500ms, 10m or 1h30m")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        stripped = text.strip().lower()
        try:
            seconds = float(stripped)
        except ValueError:
            parts = _DURATION_PART_RE.findall(stripped)
            if not parts or "".join(n + u for n, u in parts) != stripped:
                raise _duration_error(what, text, "expected e.g. 2s, 500ms, 10m or 1h30m") from None
            seconds = sum(float(n) * _DURATION_UNIT_S[u] for n, u in parts)
    if math.isnan(seconds) or seconds == -math.inf:
        raise _duration_error(what, text, "expected e.g. 2s, 500ms, 10m or 1h30m")
    if seconds <= 0:
        raise _duration_error(what, text, "must be more than zero")
    if seconds >= MAX_DURATION_S:  # "inf" and 400-digit numbers too
        raise _duration_error(what, text, "too long (must be under 1e9 seconds, about 31 years)")
    if seconds < minimum_s:
        shortest = format_duration(minimum_s, exact=True) if minimum_s >= 1 else "1ms"
        raise _duration_error(what, text, f"too short (at least {shortest})")
    return seconds


def parse_job_time(text: str | int | float, *, what: str = "--time") -> float:
    """A job's time limit: `parse_duration`, and at least MIN_JOB_TIME_S."""
    return parse_duration(text, what=what, minimum_s=MIN_JOB_TIME_S)


def format_duration(seconds: float, *, exact: bool = False) -> str:
    """Seconds for people, in the units `parse_duration` reads.

    In a table (the default) the two largest units, cut down (never rounded up) to at
    most six characters: 45s, 12m, 1h02m, 3d04h. `exact=True`, for a duration someone set
    and reads back (a time limit): every unit down to the second and any fraction of it,
    1.5s, 1m30s, 1h30m, 2d, so that it parses back to the same number.
    """
    if not exact:
        s = max(0, int(seconds))
        if s < 60:
            return f"{s}s"
        if s < 3600:
            return f"{s // 60}m"
        if s < 86400:
            return f"{s // 3600}h{s % 3600 // 60:02d}m"
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    whole, fraction = divmod(max(0.0, seconds), 1)
    rest = int(whole)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    if rest or fraction or not parts:
        parts.append(f"{rest + fraction:g}s")
    return "".join(parts)


# How busy a simulated job keeps its card unless told otherwise (`simulate_util`): light,
# as a job that mostly waits on its data, so that a try-out shows jobs sharing a card.
LIGHT_UTIL = 10

_SIM_PART_RE = re.compile(r"^\s*(?:(\d+)\s*x\s*)?([0-9.]+\s*[KMGT]?)\s*$", re.IGNORECASE)


def parse_simulate_spec(spec: str) -> list[int]:
    """ "2x24G" -> [24G, 24G]; "24G,16G" -> [24G, 16G]; "2x24G,80G" mixes both."""
    sizes: list[int] = []
    for part in spec.split(","):
        match = _SIM_PART_RE.match(part)
        if not match:
            raise ConfigError(f"invalid simulate spec {spec!r}: expected e.g. 2x24G or 24G,16G")
        count = int(match.group(1) or 1)
        if count < 1 or count > 256:
            raise ConfigError(f"invalid simulate spec {spec!r}: 1 to 256 GPUs per part")
        sizes.extend([parse_size(match.group(2))] * count)
    return sizes
