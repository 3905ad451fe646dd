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
  *Contention*: at least half of its polls on a card saturated by it and other busy jobs
  (gpusched.usage.demand) and a mean under 80 %: its own figure is its time slice, not
  what it would use alone (FIELD.md: two busy jobs sharing an H200 each read ~50 %,
  swinging 0-99 %, while the device read 100 %). The hint names the jobs it shared with,
  what it ran at, and what `--exclusive` or a quieter card would give; never the data
  loader. Only a job that was (almost) never on a saturated shared card (under 20 % of
  its polls) is judged on the two rules below: its low figure is its own.
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
from collections.abc import Sequence
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
CONTENDED_FRACTION = 0.5  # of its polls on a saturated shared card: contention
QUIET_FRACTION = 0.2  # under this, its utilization is its own (data/CPU hints)
DEFAULT_MIN_RUNTIME_S = 120.0


def suggest_mem(peak_bytes: int) -> int:
    """A `--mem` for a job that peaked at `peak_bytes`: +10 %, rounded up (GiB, or 256 MiB)."""
    return suggest_size(math.ceil(peak_bytes * (1 + SUGGEST_MARGIN)))


def suggest_size(wanted: int) -> int:
    """`wanted` bytes rounded up to a size a person would write: whole GiB, or 256 MiB
    below 2 GiB."""
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
    # After an OOM: 1.5x --mem, if a GPU here gives that much; its own --mem where a
    # process gpusched did not start filled the card (the room was the job's)
    oom_next_mem: int | None = None
    # Of its polls, the share on a card saturated by it and others (gpusched.usage.demand)
    contended_fraction: float = 0.0
    shared_with: tuple[int, ...] = ()  # the busy jobs it took turns with
    shared_gpus: tuple[int, ...] = ()  # where
    sharing_speed: float | None = None  # its speed then, against alone


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
        f"{keep_within(suggest_mem(peak), facts.card_bytes)}"
    )


def keep_within(mem: int, card_bytes: int | None) -> str:
    """How a PyTorch job keeps itself within its --mem on a card of `card_bytes`: gpusched
    sets nothing inside a job's interpreter (JAX is told its share by the environment,
    XLA_PYTHON_CLIENT_MEM_FRACTION; TensorFlow allocates as it goes, no cap), so the job
    has to. "" when the card's size is not known."""
    if not card_bytes or mem >= card_bytes:
        return ""
    fraction = max(1, mem * 100 // card_bytes) / 100  # down: within the declared size
    return (
        f"; in PyTorch, torch.cuda.set_per_process_memory_fraction({fraction:.2f}) at its"
        f" start keeps it within --mem {mem_option(mem)} on a"
        f" {format_size(card_bytes, tabular=False)} card (an error in it, not in its"
        " neighbours)"
    )


def sharing_note(
    speed: float | None, gpus: Sequence[int], shared_with: Sequence[int]
) -> str | None:
    """What sharing a busy card cost a job: "ran at about 0.5x: it shared GPU 0 with job 12,
    also busy"; None when it ran at about full speed (0.9x or more) or that is unknown."""
    if speed is None or speed >= 0.9 or not gpus:
        return None
    cards = ", ".join(str(g) for g in gpus)
    where = f"GPU {cards}" if len(gpus) == 1 else f"GPUs {cards}"
    if not shared_with:
        return f"ran at about {speed:.1f}x: it shared {where} with other busy processes"
    jobs = ", ".join(str(j) for j in shared_with)
    whom = f"job {jobs}, also busy" if len(shared_with) == 1 else f"jobs {jobs}, also busy"
    return f"ran at about {speed:.1f}x: it shared {where} with {whom}"


def contention_hint(facts: JobFacts) -> str | None:
    """Low own utilization on a busy shared card: the jobs took turns, not a data problem."""
    mean = facts.util_mean
    if facts.util_samples < MIN_UTIL_SAMPLES or mean is None or mean >= SWING_MAX_MEAN:
        return None
    if facts.contended_fraction < CONTENDED_FRACTION:
        return None
    cards = ", ".join(str(g) for g in facts.shared_gpus) or "its GPU"
    where = f"GPU {cards}" if len(facts.shared_gpus) <= 1 else f"GPUs {cards}"
    if facts.shared_with:
        jobs = ", ".join(str(j) for j in facts.shared_with)
        whom = f"job {jobs}" if len(facts.shared_with) == 1 else f"jobs {jobs}"
    else:
        whom = "other busy processes"
    speed = facts.sharing_speed
    gain = (
        f"; it ran at about {speed:.1f}x, so a card to itself would run it about"
        f" {1 / speed:.1f}x faster"
        if speed and speed < 0.9
        else ""
    )
    return (
        f"GPU busy {mean:.0f}% on average while {where} was fully busy, shared with {whom}:"
        f" the jobs took turns (contention, not a data or CPU problem){gain}; submit with"
        " --exclusive, or when a quieter card is free"
    )


def utilization_hint(facts: JobFacts) -> str | None:
    mean, low, high, spread = facts.util_mean, facts.util_min, facts.util_max, facts.util_stddev
    if facts.util_samples < MIN_UTIL_SAMPLES:
        return None
    if facts.contended_fraction >= QUIET_FRACTION:
        return None  # its figure was (partly) its time slice: contention_hint's to judge
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
        hint = (
            f"ran out of GPU memory with --mem {declared}, not retried"
            f" ({facts.retry_refused}): {smaller}"
        )
    else:
        hint = _resubmit_hint(facts.oom_next_mem, facts.mem, declared, smaller)
    if facts.oom_next_mem == facts.mem:  # another process took its room: it kept within
        return hint
    return f"{hint}{keep_within(facts.oom_next_mem or facts.mem, facts.card_bytes)}"


def _resubmit_hint(next_mem: int | None, mem: int, declared: str, smaller: str) -> str:
    """After an OOM that was not retried: with what --mem to resubmit, if any."""
    if next_mem == mem:
        return (
            f"ran out of GPU memory with --mem {declared} on a card a process gpusched did"
            " not start had filled: resubmit it as it was (--retry-oom N does that by"
            " itself; it waits until there is room)"
        )
    if next_mem is None:
        return (
            f"ran out of GPU memory with --mem {declared}, already about the most"
            f" a GPU here gives: {smaller}"
        )
    return (
        f"ran out of GPU memory with --mem {declared}: resubmit with --mem"
        f" {mem_option(next_mem)} (--retry-oom N does that by itself), or {smaller}"
    )


# Its cores count as saturated at this share of them busy on average (CPU time / run time).
CORES_SATURATED = 0.9


def cores_hint(
    cpu_s: float | None, run_s: float | None, cores: int | None, util_mean: float | None
) -> str | None:
    """Its cores busy throughout while the GPU waited: a starved loader, or too few cores
    (FIELD.md: low utilization alone on a card usually means data loading)."""
    if not cpu_s or not run_s or not cores or util_mean is None:
        return None
    if run_s < DEFAULT_MIN_RUNTIME_S or util_mean >= LOW_UTIL:
        return None
    used = cpu_s / run_s
    if used < CORES_SATURATED * cores:
        return None
    return (
        f"used {used:.1f} of {cores} cores on average while the GPU was {util_mean:.0f}%"
        " busy: raise --cpus, or num_workers if the loader is the bottleneck"
    )


def job_hints(facts: JobFacts, min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> list[str]:
    """Every hint the job deserves, most important first."""
    long_enough = facts.runtime_s is not None and facts.runtime_s >= min_runtime_s
    rules = [oom_hint, over_declared_hint]
    if long_enough:
        rules += [oversized_hint, contention_hint, utilization_hint]
    return [hint for rule in rules if (hint := rule(facts)) is not None]
