"""The honest packing benchmark's trace: a fixed lab trace, sized from FIELD.md.

Fixed so that nobody tunes it to a policy (packing_honest.py's seeds: 20261121, 1, 2, 3):

- **4 users** of unequal weight (40/30/20/10 %), **Poisson arrivals** (exponential gaps).
- **The lab mix**, drawn per job from a stream of its own: 40 % data-starved (demand 5-30 %),
  40 % busy (80-100 %), 20 % memory-bound (80-100 %, memory-bound), each job's demand
  drawn within its kind's range.
- **Kinds drawn apart from names.** Each user has NAMES_PER_KIND names per kind; a job
  takes one of its own kind's names with probability OWN_KIND_NAME, else any of its
  user's names (a `train.py` run for everything), so a name's history is often right,
  not always. The command is the name's (history keys on `--name`, then the command).
- **The offered load**: the jobs' solo GPU-time over the window is OFFERED_LOAD of the
  cards' time (`window_s`), so one job per GPU keeps the cards 70-90 % busy over it
  (packing_honest.py measures and prints how busy).
- **Memory from FIELD.md's measured training memory** (GPT-2-medium-sized model, AdamW,
  as NVML reports the process): ~0.5 GiB of CUDA context, then per parameter 16.9 bytes
  (fp32) or 18.4 (bf16 autocast), plus per sample 1.55 GiB (fp32) or 1.12 GiB (AMP) at
  354.8M parameters, scaled by model size; models of 60M-1.5B parameters (log-uniform),
  batches of 1-32. A peak past what an 80 GB H100 leaves (76 GiB) halves the batch.
- **Declarations**: 10 % whole-GPU (no --mem); 15 % under-declared (the peak is 1.05-1.6x
  the declaration: these OOM where the card cannot hold it); the rest round their peak
  up to whole GiB with 0-30 % to spare (at most what a card offers).
- **Durations**: FIELD.md has none; log-normal, median 40 min, 3 min-12 h (as packing.py).
- 10 % of jobs on 2 cards, 2 % on all 4.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

GiB = 2**30
GPU_COUNT = 4
GPU_MEM = 80 * GiB  # an H100 80GB (FIELD.md: "A data-centre H100 has 80 GB")
MAX_PEAK = 76 * GiB
MAX_DECLARED = 79 * GiB  # a card less the default headroom: gpusched refuses more

USERS = (("alice", 0.4), ("bob", 0.3), ("carol", 0.2), ("dan", 0.1))
KINDS = ("starved", "busy", "memory")
LAB_MIX = (0.4, 0.4, 0.2)
DEMAND_RANGE = {"starved": (0.05, 0.30), "busy": (0.80, 1.00), "memory": (0.80, 1.00)}
NAMES_PER_KIND = 3
OWN_KIND_NAME = 0.7  # else any of the user's names, of whatever kind
OFFERED_LOAD = 0.8

# FIELD.md, "Measured on a real card": GPT-2-medium (354.8M parameters), AdamW, seq 512.
CONTEXT_BYTES = int(0.5 * GiB)
REF_PARAMS = 354.8e6
BYTES_PER_PARAM = {"fp32": 16.9, "amp": 18.4}
PER_SAMPLE_AT_REF = {"fp32": 1.55 * GiB, "amp": 1.12 * GiB}
PARAMS_RANGE = (60e6, 1.5e9)
BATCHES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Job:
    job_id: int
    user: str
    uid: int
    name: str  # what history is kept by (with the command); says little of the kind
    arrival_s: float
    gpus: int
    declared_bytes: int | None  # --mem per GPU; None: a whole GPU
    peak_bytes: int  # what it really allocates on each of its GPUs
    duration_s: float  # alone on its GPUs
    kind: str
    demand: float  # its true share of a card's time alone, 0-1
    memory_bound: bool

    @property
    def command(self) -> list[str]:
        return ["python", f"{self.name.split('/')[-1]}.py"]


def peak_memory(rng: random.Random) -> int:
    """A training job's peak per GPU, by FIELD.md's measured fixed and per-sample parts."""
    params = math.exp(rng.uniform(*(math.log(p) for p in PARAMS_RANGE)))
    precision = rng.choice(("fp32", "amp"))
    batch = rng.choice(BATCHES)
    fixed = CONTEXT_BYTES + params * BYTES_PER_PARAM[precision]
    per_sample = PER_SAMPLE_AT_REF[precision] * params / REF_PARAMS
    while batch > 1 and fixed + batch * per_sample > MAX_PEAK:
        batch //= 2
    return int(min(MAX_PEAK, fixed + batch * per_sample))


def _declared(rng: random.Random, peak: int) -> int | None:
    shape = rng.random()
    if shape < 0.10:
        return None
    if shape < 0.25:
        return max(GiB, math.ceil(peak / rng.uniform(1.05, 1.6) / GiB) * GiB)
    return min(MAX_DECLARED, math.ceil(peak * rng.uniform(1.0, 1.3) / GiB) * GiB)


def _kind(rng: random.Random) -> tuple[str, float, bool]:
    kind = rng.choices(KINDS, LAB_MIX)[0]
    return kind, rng.uniform(*DEMAND_RANGE[kind]), kind == "memory"


def _name(rng: random.Random, user: str, kind: str) -> str:
    if rng.random() < OWN_KIND_NAME:
        return f"{user}/{kind}-{rng.randrange(NAMES_PER_KIND)}"
    other = rng.choice(KINDS)
    return f"{user}/{other}-{rng.randrange(NAMES_PER_KIND)}"


def make_trace(
    seed: int | str, n_jobs: int, gpu_count: int = GPU_COUNT, first_id: int = 1
) -> tuple[list[Job], float]:
    """`n_jobs` jobs and the window they arrive over (seconds), the window sized so that
    their solo GPU-time is OFFERED_LOAD of the cards' time over it."""
    sizes = random.Random(f"{seed}-sizes")
    kinds = random.Random(f"{seed}-kinds")
    users = [name for name, _ in USERS]
    weights = [weight for _, weight in USERS]
    drawn = []
    for _ in range(n_jobs):
        user = sizes.choices(users, weights)[0]
        peak = peak_memory(sizes)
        declared = _declared(sizes, peak)
        width = sizes.random()
        gpus = min(gpu_count, 4 if width < 0.02 else 2 if width < 0.12 else 1)
        duration = min(12 * 3600.0, max(180.0, sizes.lognormvariate(math.log(40 * 60), 1.0)))
        kind, demand, memory_bound = _kind(kinds)
        drawn.append((user, peak, declared, gpus, duration, kind, demand, memory_bound))
    gpu_s = sum(d[4] * d[3] for d in drawn)
    window_s = gpu_s / (gpu_count * OFFERED_LOAD)
    gaps = [sizes.expovariate(1.0) for _ in drawn]
    scale = window_s / sum(gaps)  # Poisson arrivals, their last at the window's end
    trace, t = [], 0.0
    for i, ((user, peak, declared, gpus, duration, kind, demand, mb), gap) in enumerate(
        zip(drawn, gaps, strict=True)
    ):
        t += gap * scale
        name = _name(kinds, user, kind)
        uid = 1000 + users.index(user)
        trace.append(
            Job(first_id + i, user, uid, name, t, gpus, declared, peak, duration, kind, demand, mb)
        )
    return trace, window_s


def describe(trace: list[Job], window_s: float) -> str:
    """A few lines on what the trace holds."""
    per_user = ", ".join(f"{u} {sum(j.user == u for j in trace)}" for u, _ in USERS)
    per_kind = ", ".join(f"{k} {sum(j.kind == k for j in trace)}" for k in KINDS)
    own = sum(j.name.split("/")[1].startswith(j.kind) for j in trace)
    peaks = sorted(j.peak_bytes for j in trace)
    whole = sum(j.declared_bytes is None for j in trace)
    over = sum(j.declared_bytes is not None and j.peak_bytes > j.declared_bytes for j in trace)
    return (
        f"{len(trace)} jobs over {window_s / 3600:.1f} h; users: {per_user}; kinds: {per_kind}\n"
        f"  named after their own kind {own}; peak memory median"
        f" {peaks[len(peaks) // 2] / GiB:.1f} GiB, max {peaks[-1] / GiB:.1f} GiB; whole-GPU"
        f" {whole}, over their declaration {over}, multi-GPU {sum(j.gpus > 1 for j in trace)}"
    )
