"""Whether a failed job ran out of GPU memory, and the --mem of its OOM retry. Pure.

A job that failed is called out of memory (reason `oom`, retried with `--retry-oom`) on
evidence only, any one of:

1. **Its log says so**: an out-of-memory message of PyTorch, TensorFlow, JAX, cuBLAS,
   cuDNN, NCCL, CuPy or numba among the last lines of its log (`oom_in_log`).
2. **Its own peak went past its declaration**: it grew beyond the room gpusched kept for it,
   into memory its neighbours were placed on, so its next allocation could fail.
3. **A card of its had under half the headroom free** at the last poll before it died
   (`headroom` is what gpusched never hands out; with less than half of it left, not even
   a small allocation fits).

A card that merely looks full is not evidence: gpusched itself packs cards to `headroom`
free, and a rule such as free <= max(256M, 2 % of the card) sits above that: it would call
an ordinary failure (a KeyError) on a well-packed 80G card OOM and retry it at 60G.

The retry asks 1.5x the memory rounded up (whole G, 256M below 2G), capped at what
`submit` would accept (NVML v2's usable memory, used + free, less the headroom, on the
job's N-th largest card) and at the owner's `max_mem` divided over its GPUs; no retry
when that cap is not above its --mem.
Unless the card was filled by a process gpusched did not start (`filled_by_other`): the
job stayed within its --mem and that process took the room it was promised, so the
retry keeps its --mem and waits for the room.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched.core.hints import suggest_size
from gpusched.core.units import format_size

# Where a log "ends": its last 40 non-empty lines (in at most its last 16 KiB). A Python
# traceback puts the error last, but launchers (torchrun's failure summary, TensorFlow's
# "Hint: ..." lines) print a few lines after it; an OOM that was caught and survived long
# before the end is not what killed the job.
OOM_TAIL_LINES = 40
OOM_TAIL_BYTES = 16 * 1024

OOM_PATTERN = re.compile(
    r"CUDA out of memory"  # PyTorch: "torch.OutOfMemoryError: CUDA out of memory. Tried to..."
    r"|torch\.(?:cuda\.)?OutOfMemoryError"
    r"|CUDA error: out of memory"  # cudaErrorMemoryAllocation, from any CUDA program
    r"|ResourceExhaustedError"  # TensorFlow
    r"|OOM when allocating"  # TensorFlow's message for it
    r"|RESOURCE_EXHAUSTED: Out of memory"  # JAX / XLA
    r"|CUBLAS_STATUS_ALLOC_FAILED"  # cuBLAS could not allocate its workspace
    r"|CUDNN_STATUS_NOT_ENOUGH_MEMORY|CUDNN_STATUS_ALLOC_FAILED"  # cuDNN (8, 9)
    r"|Cuda failure (?:\d+ )?'out of memory'"  # NCCL: "NCCL WARN Cuda failure 'out of memory'"
    r"|cupy\.cuda\.memory\.OutOfMemoryError|OutOfMemoryError: Out of memory allocating"  # CuPy
    r"|CUDA_ERROR_OUT_OF_MEMORY"  # the driver API's name for it (numba: "... results in ...")
)

RETRY_GROWTH = 1.5


def _size(n_bytes: int) -> str:
    return format_size(n_bytes, tabular=False)


@dataclass(frozen=True)
class CardSeen:
    """The fullest of a job's cards at one poll (what `UsageTracker.last_card` keeps)."""

    index: int
    free_bytes: int
    total_bytes: int
    held_bytes: int  # by the job, on this card
    # The largest process there gpusched did not start, and what all such held.
    other_pid: int | None = None
    other_uid: int | None = None  # None: not read
    other_bytes: int = 0

    @classmethod
    def from_state(cls, state: Mapping[str, int] | None) -> CardSeen | None:
        if not state:
            return None
        try:
            other_pid, other_uid = state.get("other_pid"), state.get("other_uid")
            return cls(
                int(state["index"]),
                int(state["free_bytes"]),
                int(state["total_bytes"]),
                int(state["held_bytes"]),
                None if other_pid is None else int(other_pid),
                None if other_uid is None else int(other_uid),
                int(state.get("other_bytes", 0)),
            )
        except (KeyError, TypeError, ValueError):
            return None  # a state written by another version: no evidence


def oom_in_log(tail: str) -> str | None:
    """The out-of-memory line near the end of a log, or None."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines[-OOM_TAIL_LINES:]):
        if OOM_PATTERN.search(line):
            return line if len(line) <= 200 else line[:197] + "..."
    return None


def short_of_memory(free_bytes: int, headroom_bytes: int) -> bool:
    """True when a card had less free than even a small allocation needs: under half the
    headroom (with no headroom, nothing at all)."""
    return free_bytes < headroom_bytes / 2 if headroom_bytes > 0 else free_bytes <= 0


def oom_cause(
    *,
    log_tail: str,
    mem: int | None,
    peak_mem: int,
    last_card: CardSeen | None,
    headroom_bytes: int,
) -> str | None:
    """Why a job that failed ran out of GPU memory, in words; None when nothing says so."""
    line = oom_in_log(log_tail)
    if line is not None:
        return f"out of GPU memory: {line}"
    if mem is not None and peak_mem > mem:
        return (
            f"out of GPU memory: it died after its peak {_size(peak_mem)} went past"
            f" its --mem {_size(mem)}"
        )
    if (
        last_card is not None
        and last_card.held_bytes > 0
        and short_of_memory(last_card.free_bytes, headroom_bytes)
    ):
        return (
            f"out of GPU memory: it died while GPU {last_card.index} was full:"
            f" {_size(last_card.free_bytes)} of {_size(last_card.total_bytes)}"
            f" free, the job holding {_size(last_card.held_bytes)}"
        )
    return None


def filled_by_other(mem: int | None, peak_mem: int, last_card: CardSeen | None) -> bool:
    """Whether the job ran short because a process gpusched did not start filled its card:
    it never went past its --mem, the card had no room left for the rest of it, and such
    processes held at least what was missing."""
    if mem is None or last_card is None or peak_mem > mem or not last_card.other_pid:
        return False
    missing = mem - last_card.held_bytes - last_card.free_bytes
    return 0 < missing <= last_card.other_bytes


def other_words(card: CardSeen, owner: str, mem: int) -> str:
    """What filled the card, for the job's end: the process's pid and owner, never its
    command line (another user's arguments are theirs)."""
    return (
        f"GPU {card.index} was filled by pid {card.other_pid} (user {owner}), which gpusched"
        f" did not start ({_size(card.other_bytes)} held by such processes), while the job"
        f" held {_size(card.held_bytes)} of its --mem {_size(mem)}"
    )


def retry_mem(
    mem: int | None,
    gpus: int,
    usable_bytes: Sequence[int],
    headroom_bytes: int,
    max_mem_bytes: int | None,
) -> tuple[int | None, str]:
    """The --mem of an OOM retry, or None and why there is none.

    `usable_bytes`: what jobs could ever use on each card (NVML v2: used + free).
    `max_mem_bytes`: the owner's limit on declared memory summed over GPUs, or None.
    """
    if mem is None:
        return None, "it already had a whole GPU"
    sizes = sorted((size - headroom_bytes for size in usable_bytes), reverse=True)
    if len(sizes) < gpus:
        return None, f"fewer than {gpus} GPUs are left"
    cap, why = sizes[gpus - 1], "the most a GPU here gives"
    if max_mem_bytes is not None and max_mem_bytes // gpus < cap:
        cap = max_mem_bytes // gpus
        why = f"the most your max_mem {_size(max_mem_bytes)} allows"
    # Rounded up as --mem suggestions are (whole G, or 256M below 2G): a hint names it.
    wanted = suggest_size(math.ceil(mem * RETRY_GROWTH))
    retry = min(wanted, cap // 2**20 * 2**20)  # whole MiB, so its --mem reads back as written
    if retry <= mem:
        return None, f"{_size(mem)} is already {why}"
    return retry, ""
