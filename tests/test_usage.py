"""Unit tests of the pure parts of "know your jobs": usage trackers, OOM logs, hints."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.hints import (
    JobFacts,
    job_hints,
    mem_option,
    oom_hint,
    over_declared_hint,
    oversized_hint,
    suggest_mem,
    utilization_hint,
)
from gpusched.core.units import parse_size
from gpusched.usage.oom import oom_in_log
from gpusched.usage.tracker import UsageTracker, job_utilization, overrun_limit

GiB = 2**30
MiB = 2**20

# -- the tracker ------------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=200))
def test_tracker_mean_and_spread_match_the_samples(samples: list[int]) -> None:
    tracker = UsageTracker()
    for value in samples:
        tracker.observe_util(value)
    assert tracker.util_samples == len(samples)
    assert tracker.util_mean == pytest.approx(statistics.fmean(samples))
    assert tracker.util_stddev == pytest.approx(statistics.pstdev(samples), abs=1e-6)
    assert (tracker.util_min, tracker.util_max) == (min(samples), max(samples))
    summary = tracker.summary()
    assert summary["mean_util"] == round(statistics.fmean(samples))
    # The state survives a daemon restart unchanged.
    assert UsageTracker.from_state(tracker.to_state()) == tracker


@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 80 * GiB)), max_size=30))
def test_tracker_peak_is_the_largest_per_gpu_figure_and_never_falls(
    polls: list[dict[str, int]],
) -> None:
    tracker = UsageTracker()
    peak = 0
    for poll in polls:
        rose = tracker.observe_memory(poll, None)
        new_peak = max([peak, *poll.values()])
        assert rose == (new_peak > peak)
        peak = new_peak
        assert tracker.peak_mem == peak


def test_tracker_keeps_only_the_last_full_card_and_ignores_unknown_state_keys() -> None:
    tracker = UsageTracker()
    card = {"index": 0, "free_bytes": 0, "total_bytes": GiB, "held_bytes": GiB}
    tracker.observe_memory({"a": GiB}, card)
    tracker.observe_memory({"a": GiB}, None)
    assert tracker.last_card is None
    assert UsageTracker.from_state({"peak_mem": 5, "from_the_future": 1}).peak_mem == 5
    assert UsageTracker.from_state(None) == UsageTracker()
    assert UsageTracker().summary() == {
        "peak_mem": None,
        "mean_util": None,
        "util_min": None,
        "util_max": None,
        "util_stddev": None,
        "demand": None,
        "shared_with": [],
        "sharing_speed": None,
    }


def test_utilization_prefers_per_process_samples_and_falls_back_to_the_gpu() -> None:
    pids = {"g0": [10, 11], "g1": [12]}
    # Per process: the job's own processes only (pid 99 is a neighbour), capped at 100.
    assert job_utilization(pids, {"g0": {10: 30, 11: 20, 99: 50}, "g1": {12: 70}}, {}) == 60
    assert job_utilization({"g0": [10, 11]}, {"g0": {10: 80, 11: 70}}, {}) == 100
    # No sample for the job on a busy card: unknown this poll, not 0 % (FIELD.md: a job
    # taking turns on a shared H200 had none in 2-3 of 17 polls, a light one in 13).
    assert job_utilization({"g0": [10]}, {"g0": {}}, {"g0": 90}) is None
    assert job_utilization({"g0": [10]}, {"g0": {99: 60}}, {"g0": 100}) is None
    # ... but on a card that itself read idle, it ran nothing.
    assert job_utilization({"g0": [10]}, {"g0": {}}, {"g0": 0}) == 0
    # No per-process sampling on g1: the whole GPU's figure.
    assert job_utilization(pids, {"g0": {10: 40}}, {"g1": 80}) == 60
    assert job_utilization(pids, None, {"g0": 10, "g1": 30}) == 20
    assert job_utilization(pids, None, {"g0": None}) is None


def test_overrun_limit_adds_the_margin() -> None:
    assert overrun_limit(10 * GiB, 0.10, 0) == 11 * GiB
    assert overrun_limit(10 * GiB, 0.0, GiB) == 11 * GiB
    assert overrun_limit(10 * GiB, 0.0, 0) == 10 * GiB


# -- out of memory in a log -------------------------------------------------------------------

TORCH = (
    "epoch 3 step 100 loss 0.53\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 9, in <module>\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
)
TORCH_OLD = (
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total)\n"
)
TENSORFLOW = (
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor"
    " with shape[256,1024,14,14] and type float on /job:localhost/replica:0/task:0/device:GPU:0\n"
    "Hint: If you want to see a list of allocated tensors when OOM happens, add"
    " report_tensor_allocations_upon_oom to RunOptions for current allocation info.\n"
)
JAX = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to"
    " allocate 17179869184 bytes.\n"
)


@pytest.mark.parametrize("log", [TORCH, TORCH_OLD, TENSORFLOW, JAX])
def test_oom_messages_of_each_framework_are_found_at_the_end(log: str) -> None:
    line = oom_in_log(log + "\n\n")
    assert line is not None
    assert line in log


def test_an_oom_long_before_the_end_or_another_error_is_not_an_oom() -> None:
    later = "".join(f"step {i} loss 0.1\n" for i in range(40))
    assert oom_in_log(TORCH + later + "ValueError: bad label\n") is None
    assert oom_in_log("ValueError: bad label\nout of memory in the host\n") is None
    assert oom_in_log("") is None
    long_line = "torch.OutOfMemoryError: CUDA out of memory. " + "x" * 500
    found = oom_in_log(long_line)
    assert found is not None
    assert len(found) == 200


# -- hints ---------------------------------------------------------------------------------------


def facts(**changes: object) -> JobFacts:
    base: dict[str, object] = {
        "mem": 8 * GiB,
        "state": "done",
        "reason": "exit",
        "runtime_s": 600.0,
        "peak_mem": 7 * GiB,
        "util_mean": 90.0,
        "util_min": 85.0,
        "util_max": 95.0,
        "util_stddev": 3.0,
        "util_samples": 100,
        "card_bytes": 24 * GiB,
    }
    base.update(changes)
    return JobFacts(**base)  # type: ignore[arg-type]


def test_a_well_sized_busy_job_gets_no_hint() -> None:
    assert job_hints(facts()) == []


def test_oversized_hint_needs_a_ratio_and_a_gap_and_a_good_end() -> None:
    hint = oversized_hint(facts(mem=20 * GiB, peak_mem=int(6.1 * GiB)))
    assert hint == "declared 20G, peak 6.1G: --mem 7G would let others share the card"
    assert oversized_hint(facts(mem=3 * GiB - 1, peak_mem=GiB)) is None  # 3x, under 2G apart
    assert oversized_hint(facts(mem=3 * GiB, peak_mem=GiB)) is not None  # 2G apart
    assert oversized_hint(facts(mem=70 * GiB, peak_mem=50 * GiB)) is None  # 20G apart, 1.4x
    assert oversized_hint(facts(mem=20 * GiB, peak_mem=6 * GiB, state="failed")) is None
    assert oversized_hint(facts(mem=None, peak_mem=6 * GiB)) is None


def test_over_declared_hint_whenever_the_peak_passed_the_declared_size() -> None:
    hint = over_declared_hint(facts(mem=4 * GiB, peak_mem=6 * GiB))
    assert hint is not None
    assert hint.startswith("peak 6G went above the declared 4G")
    assert "declare --mem 7G; in PyTorch, torch.cuda.set_per_process_memory_fraction(0.29)" in hint
    assert over_declared_hint(facts(mem=4 * GiB, peak_mem=4 * GiB)) is None
    # Even a job too short for other hints gets this one.
    short = facts(mem=4 * GiB, peak_mem=6 * GiB, runtime_s=1.0)
    assert job_hints(short) == [hint]


@pytest.mark.parametrize(
    ("low", "high", "mean", "spread", "expected"),
    [
        (0, 95, 23, 35, "GPU busy 23% on average, swinging 0-95%: it waits for data"),
        (0, 100, 79, 30, "GPU busy 79% on average, swinging 0-100%"),  # still swinging
        (0, 100, 80, 30, None),  # busy enough
        (10, 55, 30, 19, "GPU busy only 30% on average (10-55%)"),  # not swinging: low
        (0, 45, 20, 21, "GPU busy only 20% on average (0-45%)"),  # 45 points: not swinging
        (35, 45, 40, 3, None),  # 40 %: not low
    ],
)
def test_utilization_hints(
    low: float, high: float, mean: float, spread: float, expected: str | None
) -> None:
    hint = utilization_hint(facts(util_min=low, util_max=high, util_mean=mean, util_stddev=spread))
    if expected is None:
        assert hint is None
    else:
        assert hint is not None
        assert hint.startswith(expected)


def test_utilization_and_size_hints_wait_for_enough_polls_and_runtime() -> None:
    starved = {"util_min": 0.0, "util_max": 95.0, "util_mean": 23.0, "util_stddev": 35.0}
    assert utilization_hint(facts(**starved, util_samples=9)) is None
    assert utilization_hint(facts(**starved, util_samples=10)) is not None
    big = {"mem": 20 * GiB, "peak_mem": 6 * GiB}
    assert job_hints(facts(**starved, **big, runtime_s=119.0)) == []
    assert len(job_hints(facts(**starved, **big, runtime_s=120.0))) == 2
    assert len(job_hints(facts(**starved, **big, runtime_s=5.0), min_runtime_s=5.0)) == 2


def test_oom_hints_say_what_happened_and_what_to_do() -> None:
    oom = {"state": "failed", "reason": "oom"}
    assert oom_hint(facts(**oom, retried_as=7, retry_mem=12 * GiB)) == (
        "ran out of GPU memory: retried as job 7 with --mem 12G"
    )
    hint = oom_hint(facts(**oom, oom_next_mem=12 * GiB))
    assert hint is not None
    assert "resubmit with --mem 12G (--retry-oom N does that by itself)" in hint
    hint = oom_hint(facts(**oom))
    assert hint is not None
    assert "already about the most a GPU here gives" in hint
    hint = oom_hint(facts(**oom, retry_refused="fewer than 2 GPUs are left"))
    assert hint is not None
    assert "not retried (fewer than 2 GPUs are left)" in hint
    hint = oom_hint(facts(**oom, mem=None))
    assert hint is not None
    assert hint.startswith("ran out of memory on a whole 24G GPU")
    assert oom_hint(facts()) is None
    # PyTorch is held to its --mem by the job itself: gpusched sets nothing inside it.
    hint = oom_hint(facts(**oom, oom_next_mem=12 * GiB))
    assert hint is not None
    assert hint.endswith(
        "; in PyTorch, torch.cuda.set_per_process_memory_fraction(0.50) at its start keeps it"
        " within --mem 12G on a 24G card (an error in it, not in its neighbours)"
    )
    filled = oom_hint(facts(**oom, oom_next_mem=8 * GiB))  # another process filled it
    assert filled is not None
    assert "set_per_process_memory_fraction" not in filled
    # It comes first, and a short job gets it too.
    assert job_hints(facts(**oom, runtime_s=1.0))[0].startswith("ran out of GPU memory")


@given(st.integers(min_value=1, max_value=2**44))
def test_suggest_mem_covers_the_peak_plus_10_percent_in_round_steps(peak: int) -> None:
    mem = suggest_mem(peak)
    step = GiB if mem >= 2 * GiB else 256 * MiB
    assert mem >= peak * 1.1 - 1
    assert mem % step == 0
    assert mem - step < math.ceil(peak * 1.1) or mem == step  # the smallest such step


@given(st.integers(min_value=1, max_value=2**44))
def test_mem_option_round_trips_through_parse_size_never_below(size: int) -> None:
    text = mem_option(size)
    assert parse_size(text) >= size
    assert parse_size(text) - size < MiB
