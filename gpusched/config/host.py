"""The `host:` config block: what of the server itself (its memory and cores, beside its
GPUs) the jobs may ask for with `--ram` and `--cpus`, and what a job that asks for none
gets.

The capacity is the host's memory less `ram_reserve` (a percentage or a size, at least
`ram_reserve_min`), within the service's own memory limit, and its cores less
`cpu_reserve` (kept for the daemon and the system); the policy's host rule
(gpusched.scheduling.policy.host) admits jobs within it. `job_ram` and `job_cpus` are
the defaults of a job that gives no `--ram` or `--cpus`, per GPU it takes; null: the
capacity's equal share per GPU (capacity / GPUs); `job_cpus: all`: such a job has no
cpuset and runs on every core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import UsageError
from gpusched.core.units import parse_job_ram, parse_size

_KEYS = ("ram_reserve", "ram_reserve_min", "cpu_reserve", "job_ram", "job_cpus")
JOB_CPUS_ALL = 0  # `job_cpus: all`: a job that gives no --cpus runs on every core


@dataclass(frozen=True)
class HostSettings:
    """Sizes in bytes; None: the capacity's equal share per GPU."""

    ram_reserve_fraction: float = 0.10  # of the host's memory (ram_reserve: 10%)
    ram_reserve_bytes: int = 0  # or a size (ram_reserve: 4G)
    ram_reserve_min_bytes: int = 2 * 2**30  # the reserve is never less
    cpu_reserve: int = 0  # cores no job gets (the first ones)
    job_ram_bytes: int | None = None  # a job's --ram per GPU when it gives none
    # A job's --cpus per GPU when it gives none; JOB_CPUS_ALL: no cpuset of its own.
    job_cpus: int | None = None


def _cores(key: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{key}: expected a whole number >= {least}")
    return value


def _reserve(value: Any) -> tuple[float, int]:
    """`ram_reserve`: a percentage of the host's memory ("10%") or a size ("4G")."""
    text = str(value).strip()
    if not text.endswith("%"):
        return 0.0, 0 if value in (0, "0") else parse_size(value)
    try:
        percent = float(text[:-1])
    except ValueError:
        raise UsageError(
            f"ram_reserve: expected a percentage such as 10% or a size such as 4G, not {value!r}"
        ) from None
    if not 0 <= percent < 100:
        raise UsageError("ram_reserve: expected a percentage from 0% to under 100%")
    return percent / 100, 0


def parse_host(value: Any) -> HostSettings:
    """`host: {ram_reserve: 10%, ram_reserve_min: 2G, cpu_reserve: 0, job_ram: null,
    job_cpus: null}` (a key left out: its default)."""
    if value is None:
        return HostSettings()
    if not isinstance(value, dict):
        raise UsageError(f"expected a mapping with {', '.join(_KEYS)}")
    unknown = sorted(set(map(str, value)) - set(_KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} (expected {', '.join(_KEYS)})")
    defaults = HostSettings()
    fraction, reserve = defaults.ram_reserve_fraction, defaults.ram_reserve_bytes
    if value.get("ram_reserve") is not None:
        fraction, reserve = _reserve(value["ram_reserve"])
    least = value.get("ram_reserve_min")
    job_ram, job_cpus = value.get("job_ram"), value.get("job_cpus")
    return HostSettings(
        ram_reserve_fraction=fraction,
        ram_reserve_bytes=reserve,
        ram_reserve_min_bytes=defaults.ram_reserve_min_bytes
        if least is None
        else 0
        if least in (0, "0")
        else parse_size(least),
        cpu_reserve=_cores("cpu_reserve", value.get("cpu_reserve", 0), 0),
        job_ram_bytes=None if job_ram is None else parse_job_ram(job_ram, what="job_ram"),
        job_cpus=None
        if job_cpus is None
        else JOB_CPUS_ALL
        if job_cpus == "all"
        else _cores("job_cpus", job_cpus, 1),
    )
