"""Human sizes and durations: "8G" <-> bytes, "2s"/"1h30m" <-> seconds.

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


def format_size(n_bytes: int | None) -> str:
    """Render bytes compactly: 10737418240 -> "10.0G"; None -> "-"."""
    if n_bytes is None:
        return "-"
    value = float(n_bytes)
    for suffix in ("B", "K", "M", "G"):
        # Compare after rounding, so 1023.96K shows as 1.0M rather than 1024.0K.
        if abs(round(value, 1)) < 1024:
            return f"{value:.0f}{suffix}" if suffix == "B" else f"{value:.1f}{suffix}"
        value /= 1024
    return f"{value:.1f}T"


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
