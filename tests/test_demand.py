"""A job's GPU demand and what sharing cost it (gpusched.usage.demand), on the figures NVML
gave on a real NVIDIA H200 (driver 580) in /work/shared/FIELD.md, "What NVML showed"
(0.5 s polls, 17 of them per case) and "Measured on a real card" (the speed table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from gpusched.core.hints import JobFacts, job_hints, sharing_note
from gpusched.usage.demand import CardPoll, DemandTracker, typical_demand

# A busy job's own figure beside another busy job: "53-63 % on average, swinging 33-99 %,
# no sample in 2-3 of 17 polls" (None: no sample in that poll).
BUSY_BESIDE_BUSY: list[float | None] = [
    33, 99, 45, None, 70, 60, 99, 33, 50, 62, None, 58, 45, 80, 40, 66, 55,
]  # fmt: skip
# A ~3 %-busy job beside a busy one: "33-50 % in the 4 polls that had a sample, none in 13".
LIGHT_BESIDE_BUSY: list[float | None] = [None] * 13 + [33, 50, 40, 45]


def _track(
    device: Sequence[float | None],
    own: Sequence[float | None],
    neighbours: Sequence[Mapping[int, float | None]] | None = None,
) -> DemandTracker:
    tracker = DemandTracker()
    for i, (dev, mine) in enumerate(zip(device, own, strict=True)):
        tracker.observe(
            CardPoll(
                gpu_index=0,
                device_percent=dev,
                own_percent=mine,
                sampled=True,
                neighbours={} if neighbours is None else neighbours[i],
            )
        )
    return tracker


def test_alone_on_a_card_the_devices_figure_is_the_demand() -> None:
    assert _track([98.0] * 17, [98.0] * 17).demand() == pytest.approx(0.98)  # a busy loop
    assert _track([3.0] * 17, [3.0] * 17).demand() == pytest.approx(0.03)  # a ~3 %-busy loop
    # Alone, its own sample may be missing: the device still says what it did.
    alone = _track([3.0] * 17, [None] * 17)
    assert alone.demand() == pytest.approx(0.03)
    assert alone.sharing_speed() is None


def test_two_busy_jobs_taking_turns_are_each_at_about_half_speed() -> None:
    other = [{12: 58.0}] * 17
    tracker = _track([100.0] * 17, BUSY_BESIDE_BUSY, other)
    share = sum(v or 0 for v in BUSY_BESIDE_BUSY) / 17 / 100
    assert 0.45 < share < 0.6
    # Its figure is what it obtained (a lower bound), never read as its demand: it took
    # its turn's worth of a saturated card, so it wanted the card (its half recorded as its
    # demand would make its next run look half busy)...
    assert tracker.measured_demand() is None
    assert tracker.demand() == 1.0
    # ... and it took at least its half: it is busy, so it ran at about its share
    # (FIELD.md's C+C: 0.475x and 0.477x).
    speed = tracker.sharing_speed()
    assert speed is not None
    assert speed == pytest.approx(0.475, abs=0.1)
    assert tracker.shared_with == [12]
    assert sharing_note(speed, [0], tracker.shared_with) == (
        f"ran at about {speed:.1f}x: it shared GPU 0 with job 12, also busy"
    )
    # With its demand known from its runs alone, the same polls give the same answer.
    assert tracker.sharing_speed(known_demand=1.0) == speed


def test_a_light_job_beside_a_busy_one_runs_at_about_full_speed() -> None:
    """FIELD.md's C+S: the light job ran at 0.961x; its rare samples read 33-50 %."""
    tracker = _track([99.0] * 17, LIGHT_BESIDE_BUSY, [{7: 88.0}] * 17)
    demand = tracker.demand()
    assert demand is not None
    assert demand < 0.15  # not the 33-50 % of its few samples
    assert tracker.sharing_speed() == 1.0
    assert sharing_note(tracker.sharing_speed(), [0], [7]) is None


def test_a_missing_sample_on_a_card_that_is_not_busy_is_not_zero() -> None:
    """Four ~3 %-busy loops: device 14.5 %, samples in few polls, one process in none."""
    neighbours = [{2: None, 3: None, 4: None}] * 17
    sometimes = [None] * 14 + [3.0, 3.0, 4.0]
    assert _track([14.5] * 17, sometimes, neighbours).demand() == pytest.approx(0.033, abs=0.001)
    never = _track([14.5] * 17, [None] * 17, neighbours)
    assert never.demand() is None  # unknown, not 0
    assert never.sharing_speed() is None  # the card was never saturated: no contention


def test_the_tracker_round_trips_through_its_state() -> None:
    tracker = _track([100.0] * 17, BUSY_BESIDE_BUSY, [{12: 58.0}] * 17)
    again = DemandTracker.from_state(tracker.to_state())
    assert again == tracker
    assert DemandTracker.from_state({"demand_polls": 2, "from_the_future": 1}).demand_polls == 2
    assert DemandTracker.from_state(None) == DemandTracker()


def test_the_expected_demand_from_history_is_the_median() -> None:
    assert typical_demand([]) is None
    assert typical_demand([0.9, 0.1, 0.95]) == 0.9
    assert typical_demand([0.2, 0.4]) == pytest.approx(0.3)


# -- the hints these figures give -------------------------------------------------------------

SWINGING = {"util_mean": 57.0, "util_min": 0.0, "util_max": 99.0, "util_stddev": 25.0}


def _facts(**extra: object) -> JobFacts:
    base: dict[str, object] = {
        "mem": 8 * 2**30,
        "state": "done",
        "reason": "exit",
        "runtime_s": 600.0,
        "peak_mem": 7 * 2**30,
        "util_samples": 17,
        **SWINGING,
    }
    return JobFacts(**{**base, **extra})  # type: ignore[arg-type]


def test_low_utilization_on_a_busy_shared_card_is_contention_not_data_loading() -> None:
    hints = job_hints(
        _facts(contended_fraction=1.0, shared_with=(12,), shared_gpus=(0,), sharing_speed=0.5)
    )
    assert len(hints) == 1
    assert "shared with job 12" in hints[0]
    assert "contention, not a data or CPU problem" in hints[0]
    assert "about 2.0x faster" in hints[0]
    assert "--exclusive" in hints[0]
    assert "DataLoader" not in hints[0]


def test_low_utilization_on_an_idle_card_is_a_data_or_cpu_problem() -> None:
    (hint,) = job_hints(_facts(contended_fraction=0.0))
    assert "DataLoader num_workers" in hint


def test_partly_shared_low_utilization_blames_neither() -> None:
    assert job_hints(_facts(contended_fraction=0.3, shared_with=(12,), shared_gpus=(0,))) == []


def test_a_swinging_job_beside_an_idle_one_is_not_taking_turns_at_its_peaks() -> None:
    """Judged on each poll's own device figure, a job waiting on data that peaks at 95 %
    on a card it shares with an idle job reads the card saturated at its peaks; it kept
    it busy by itself (its own figure is the device's, the neighbour reads 2 %), so
    those polls are its demand, not time slices, and the data hint still applies
    (tests/test_usage_end_to_end.py lost its DataLoader hint to this)."""
    cycle = [0.0, 95.0, 10.0, 90.0, 5.0] * 4
    tracker = _track(cycle, cycle, [{9: 2.0}] * len(cycle))
    assert tracker.contended_fraction() == 0.0
    assert tracker.demand() == pytest.approx(sum(cycle) / len(cycle) / 100, abs=0.001)
    # A busy neighbour at the same peaks: those are turns taken, as before.
    shared = _track(cycle, cycle, [{9: 40.0}] * len(cycle))
    assert shared.contended_fraction() == pytest.approx(0.2)
