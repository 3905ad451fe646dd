"""Human sizes and durations: "8G" <-> bytes, "2s"/"1h30m" <-> seconds, both ways.

Every size or duration gpusched shows people is formatted here (`format_size`,
`format_duration`), so the CLI, the daemon's messages and the supervisor's agree; the
supervisor imports this, so it stays standard library only.

Sizes are binary (1G = 2**30 bytes), as GPU memory is reported by NVML and nvidia-smi.
"""

from __future__ import annotations

import math
import re

from gpusched.core.errors import ConfigError, UsageError

_SIZE_SUFFIX = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])(?:I?B)?|B?)\s*$", re.IGNORECASE)
_DURATION_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")


def parse_size(text: str | int) -> int:
    """Parse "8G", "512M", "1.5T", "1024" (bytes) into a positive number of bytes."""
    if isinstance(text, bool):
        raise UsageError(f"invalid size {text!r}: expected a number with K, M, G or T")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise UsageError(
                f"invalid size {text!r}: expected a number with an optional unit K, M, G or T,"
                " e.g. 8G or 512M"
            )
        number, suffix = match.groups()
        value = int(float(number) * _SIZE_SUFFIX[(suffix or "").upper()])
    if value <= 0:
        raise UsageError(f"invalid size {text!r}: must be more than zero")
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


def parse_duration(text: str | int | float) -> float:
    """Parse "2s", "500ms", "1h30m", or a bare number of seconds into seconds (> 0)."""
    if isinstance(text, bool):
        raise UsageError(f"invalid duration {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        stripped = str(text).strip().lower()
        try:
            seconds = float(stripped)
        except ValueError:
            parts = _DURATION_PART_RE.findall(stripped)
            if not parts or "".join(n + u for n, u in parts) != stripped:
                raise UsageError(
                    f"invalid duration {text!r}: expected e.g. 2s, 500ms, 10m or 1h30m"
                ) from None
            seconds = sum(float(n) * _DURATION_UNIT_S[u] for n, u in parts)
    # float() also reads "nan" and "inf"; neither is a duration a timer can use.
    if not math.isfinite(seconds):
        raise UsageError(f"invalid duration {text!r}: expected e.g. 2s, 500ms, 10m or 1h30m")
    if seconds <= 0:
        raise UsageError(f"invalid duration {text!r}: must be more than zero")
    return seconds


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
