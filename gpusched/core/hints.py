"""Hints: one line each, telling a job's owner what to change next time. Pure.

`job_hints()` turns what gpusched measured about an ended job into advice. The rules and
their thresholds (chosen to be quiet unless the gain is real):

- **Declared far above the peak**: a job that ended well (`done`) and whose declared
  memory is at least 1.5x its peak *and* at least 2 GiB more than it. Both: a 1 GiB job
  declared at 2 GiB wastes little; a 60 GiB job declared at 64 GiB is fine. The suggested
  `--mem` is `suggest_mem(peak)`: the peak plus 10 % (allocators round up and a run
  varies a little), rounded up to a whole GiB (256 MiB under 2 GiB).
- **Peak above declared**: always, however short the job. gpusched placed the other jobs
  on that card counting on the declared figure, so going over put them at risk.
- **Utilization**: judged on at least 10 polls taken while the job held GPU memory.
  *Swinging*: min to max spans at least 50 points with a standard deviation of at least
  20, and a mean under 80 %: the pattern of a GPU that finishes each batch fast and then
  waits for the next one (FIELD.md: data loading first, then CPU preprocessing).
  *Low*: a steady mean under 40 %.
- **Out of memory**: always; says what gpusched did (retried) or what to do.

Size and utilization hints need the job to have run at least `min_runtime_s` (the
`hint_min_runtime` config key, 2 minutes by default): a shorter job has not reached its
steady state (data loading and compilation come first), so its figures say little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpusched.core.units import format_size, parse_size

MiB = 2**20
GiB = 2**30

OVERSIZED_RATIO = 1.5
OVERSIZED_MIN_GAP_BYTES = 2 * GiB
SUGGEST_MARGIN = 0.10
MIN_UTIL_SAMPLES = 10
SWING_RANGE = 50.0
SWING_STDDEV = 20.0
SWING_MAX_MEAN = 80.0
LOW_UTIL = 40.0
DEFAULT_MIN_RUNTIME_S = 120.0


def suggest_mem(peak_bytes: int) -> int:
    """A `--mem` for a job that peaked at `peak_bytes`: +10 %, rounded up (GiB, or 256 MiB)."""
    wanted = math.ceil(peak_bytes * (1 + SUGGEST_MARGIN))
    step = GiB if wanted >= 2 * GiB else 256 * MiB
    return max(step, -(-wanted // step) * step)


def mem_option(n_bytes: int) -> str:
    """A size as a --mem argument: "7G" or "23.5G" when that is exact, else M (rounded up)."""
    text = format_size(n_bytes, tabular=False)
    if text[-1] in "GT" and parse_size(text) == n_bytes:
        return text
    return f"{-(-n_bytes // MiB)}M"


@dataclass(frozen=True)
class JobFacts:
    """What the hints are made from: the job's spec, its end and what was measured."""

    mem: int | None  # declared per GPU; None = a whole GPU
    state: str
    reason: str | None
    runtime_s: float | None  # from start to end
    peak_mem: int | None = None
    util_mean: float | None = None
    util_min: float | None = None
    util_max: float | None = None
    util_stddev: float | None = None
    util_samples: int = 0
    card_bytes: int | None = None  # total memory of the (smallest) GPU it ran on
    retried_as: int | None = None  # the OOM retry gpusched queued
    retry_mem: int | None = None  # its --mem
    retry_refused: str | None = None  # why an OOM retry was asked for but not made
    oom_next_mem: int | None = None  # after an OOM: 1.5x --mem, if a GPU here gives that much


def oversized_hint(facts: JobFacts) -> str | None:
    mem, peak = facts.mem, facts.peak_mem
    if mem is None or not peak or facts.state != "done":
        return None
    if mem < OVERSIZED_RATIO * peak or mem - peak < OVERSIZED_MIN_GAP_BYTES:
        return None
    declared, used = format_size(mem, tabular=False), format_size(peak, tabular=False)
    return (
        f"declared {declared}, peak {used}:"
        f" --mem {mem_option(suggest_mem(peak))} would let others share the card"
    )


def over_declared_hint(facts: JobFacts) -> str | None:
    mem, peak = facts.mem, facts.peak_mem
    if mem is None or not peak or peak <= mem:
        return None
    declared, used = format_size(mem, tabular=False), format_size(peak, tabular=False)
    return (
        f"peak {used} went above the declared {declared}: the job put the"
        f" other jobs on its GPU at risk of running out of memory;"
        f" declare --mem {mem_option(suggest_mem(peak))}"
    )


def utilization_hint(facts: JobFacts) -> str | None:
    mean, low, high, spread = facts.util_mean, facts.util_min, facts.util_max, facts.util_stddev
    if facts.util_samples < MIN_UTIL_SAMPLES:
        return None
    if mean is None or low is None or high is None or spread is None:
        return None
    swinging = high - low >= SWING_RANGE and spread >= SWING_STDDEV
    if swinging and mean < SWING_MAX_MEAN:
        return (
            f"GPU busy {mean:.0f}% on average, swinging {low:.0f}-{high:.0f}%: it waits for"
            " data; try DataLoader num_workers, pin_memory, prefetch_factor (or move"
            " preprocessing to the GPU)"
        )
    if mean < LOW_UTIL and not swinging:
        return (
            f"GPU busy only {mean:.0f}% on average ({low:.0f}-{high:.0f}%): the GPU mostly"
            " waits; look for CPU work in each step (data loading, preprocessing, logging)"
            " or try a larger batch"
        )
    return None


def oom_hint(facts: JobFacts) -> str | None:
    if facts.reason != "oom":
        return None
    smaller = "lower the batch size, or use mixed precision or gradient checkpointing"
    if facts.retried_as is not None and facts.retry_mem is not None:
        return (
            f"ran out of GPU memory: retried as job {facts.retried_as}"
            f" with --mem {mem_option(facts.retry_mem)}"
        )
    if facts.mem is None:
        card = f" {format_size(facts.card_bytes, tabular=False)}" if facts.card_bytes else ""
        return f"ran out of memory on a whole{card} GPU: {smaller}"
    declared = format_size(facts.mem, tabular=False)
    if facts.retry_refused:
        return (
            f"ran out of GPU memory with --mem {declared}, not retried"
            f" ({facts.retry_refused}): {smaller}"
        )
    if facts.oom_next_mem is None:
        return (
            f"ran out of GPU memory with --mem {declared}, already about the most"
            f" a GPU here gives: {smaller}"
        )
    return (
        f"ran out of GPU memory with --mem {declared}: resubmit with --mem"
        f" {mem_option(facts.oom_next_mem)} (--retry-oom N does that by itself), or {smaller}"
    )


def job_hints(facts: JobFacts, min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> list[str]:
    """Every hint the job deserves, most important first."""
    long_enough = facts.runtime_s is not None and facts.runtime_s >= min_runtime_s
    rules = [oom_hint, over_declared_hint]
    if long_enough:
        rules += [oversized_hint, utilization_hint]
    return [hint for rule in rules if (hint := rule(facts)) is not None]
