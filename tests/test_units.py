"""Sizes and durations: what people type in --mem, config files and --timeout."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.errors import UsageError
from gpusched.core.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_job_mem,
    parse_job_time,
    parse_size,
)

K, M, G, T = 2**10, 2**20, 2**30, 2**40


# -- parse_size ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8G", 8 * G),
        ("512M", 512 * M),
        ("1.5T", 3 * T // 2),
        ("1024B", 1024),
        ("8Gi", 8 * G),
        ("8gi", 8 * G),
        ("1e3M", 1000 * M),
        ("1.5e1G", 15 * G),
        (".5G", G // 2),
        ("4K", 4 * K),
        ("8g", 8 * G),
        ("512m", 512 * M),
        ("8GiB", 8 * G),
        ("8GB", 8 * G),
        ("8gib", 8 * G),
        ("100B", 100),
        (" 8G ", 8 * G),
        ("8 G", 8 * G),
        ("0.5G", G // 2),
        (1, 1),
        (24 * G, 24 * G),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["8Q", "-1", "-1G", "0", "0G", "", "   ", "G", "8GG", "1e3", "8 G B x", "0.4", "0.0001K"],
)
def test_parse_size_rejects_text(text: str) -> None:
    with pytest.raises(UsageError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("value", [True, False, 0, -1, -(8 * G)])
def test_parse_size_rejects_bools_and_non_positive_ints(value: int) -> None:
    with pytest.raises(UsageError):
        parse_size(value)


def test_parse_size_rejects_floats_that_round_to_zero_bytes() -> None:
    with pytest.raises(UsageError, match="more than zero"):
        parse_size(0.4)  # type: ignore[arg-type]  # YAML can hand us a float


@pytest.mark.parametrize("text", ["8", "1024", "0.5", "1e3", "1" * 400])
def test_a_size_without_a_unit_is_refused_with_a_hint(text: str) -> None:
    with pytest.raises(UsageError, match="add a unit"):
        parse_size(text)
    with pytest.raises(UsageError) as info:
        parse_size(text, what="--mem")
    assert info.value.message.startswith(f"--mem {text[:12]}")


@pytest.mark.parametrize("value", ["1" * 400 + "G", "1025T", "1e999K", 10**400, 2**50 + 1])
def test_a_size_too_large_for_anything_is_one_line(value: str | int) -> None:
    with pytest.raises(UsageError, match="too large"):
        parse_size(value)


def test_parse_size_error_says_what_is_expected() -> None:
    with pytest.raises(UsageError) as info:
        parse_size("8Q")
    assert "'8Q'" in info.value.message
    assert "8G" in info.value.message


@given(st.integers(min_value=1, max_value=2**10), st.sampled_from(["B", "K", "M", "G", "T"]))
def test_parse_size_integer_with_unit(number: int, unit: str) -> None:
    scale = {"B": 1, "K": K, "M": M, "G": G, "T": T}[unit]
    assert parse_size(f"{number}{unit}") == number * scale
    assert parse_size(f"{number}{unit.lower()}") == number * scale


# -- format_size ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        (None, "-"),
        (0, "0B"),
        (512, "512B"),
        (1023, "1023B"),
        (1024, "1.0K"),
        (1536, "1.5K"),
        (512 * M, "512.0M"),
        (10 * G, "10.0G"),
        (10737418240, "10.0G"),
        (20 * G, "20.0G"),
        (3 * T // 2, "1.5T"),
        (2048 * T, "2048.0T"),
    ],
)
def test_format_size(n_bytes: int | None, expected: str) -> None:
    assert format_size(n_bytes) == expected


@given(st.integers(min_value=1, max_value=2**50))
def test_format_then_parse_is_within_rounding(n_bytes: int) -> None:
    back = parse_size(format_size(n_bytes))
    # One decimal of the chosen unit: at most 0.05 of a unit off, and the unit is <= n.
    assert abs(back - n_bytes) <= 0.05 * n_bytes + 1


@given(st.integers(min_value=1, max_value=1023), st.sampled_from([K, M, G, T]))
def test_whole_units_round_trip_exactly(count: int, unit: int) -> None:
    assert parse_size(format_size(count * unit)) == count * unit


def test_format_size_in_a_sentence_drops_a_zero_decimal() -> None:
    sizes = (0, 1023, 1024, 6 * G, int(6.1 * G), 768 * M, 3 * T // 2, None)
    assert [format_size(n, tabular=False) for n in sizes] == [
        "0B",
        "1023B",
        "1K",
        "6G",
        "6.1G",
        "768M",
        "1.5T",
        "-",
    ]


def test_format_size_rounds_up_into_the_next_unit_in_both_styles() -> None:
    almost = 1023 * K + 1000  # 1023.98K
    assert format_size(almost) == "1.0M"
    assert format_size(almost, tabular=False) == "1M"


# -- parse_duration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2s", 2.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("10m", 600.0),
        ("1d", 86400.0),
        ("1.5s", 1.5),
        ("10", 10.0),
        ("0.25", 0.25),
        (" 2S ", 2.0),
        ("1h1m1s", 3661.0),
        (3, 3.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration_accepts(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    ["abc", "0", "0s", "-1s", "-1", "", "s", "1x", "1h 30m", "1s2", "ms", "nan", "-inf"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e9", "too long"),
        (1e9, "too long"),
        ("1" * 400, "too long"),
        ("inf", "too long"),
        ("0.0001ms", "too short (at least 1ms)"),
        (0.0001, "too short"),
    ],
)
def test_a_duration_out_of_range_says_which_way(text: str | float, expected: str) -> None:
    with pytest.raises(UsageError, match=re.escape(expected)):
        parse_duration(text)


def test_a_job_time_limit_is_at_least_a_second() -> None:
    assert parse_job_time("1s") == 1.0
    with pytest.raises(UsageError, match=re.escape("--time 999ms: too short (at least 1s)")):
        parse_job_time("999ms")


def test_a_job_mem_is_at_least_256m() -> None:
    assert parse_job_mem("256M") == 256 * M
    assert parse_job_mem(256 * M) == 256 * M
    with pytest.raises(UsageError, match="--mem 255M: at least 256M"):
        parse_job_mem("255M")
    with pytest.raises(UsageError, match="mem 1: add a unit"):
        parse_job_mem("1", what="mem")


@pytest.mark.parametrize("value", [True, 0, -1, 0.0, -0.5, math.nan, math.inf])
def test_parse_duration_rejects_non_positive_and_non_finite_numbers(value: float) -> None:
    with pytest.raises(UsageError):
        parse_duration(value)


@given(
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=999),
)
def test_parse_duration_sums_parts(hours: int, minutes: int, seconds: int, millis: int) -> None:
    parts = [(hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms")]
    text = "".join(f"{n}{u}" for n, u in parts if n)
    expected = hours * 3600 + minutes * 60 + seconds + millis / 1000
    if expected == 0:
        with pytest.raises(UsageError):
            parse_duration(text or "0s")
    else:
        assert parse_duration(text) == pytest.approx(expected)


# -- format_duration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "0s"), (0.5, "0.5s"), (90, "1m30s"), (3600, "1h"), (5400, "1h30m"), (3661, "1h1m1s")],
)
def test_format_duration_exact(seconds: float, expected: str) -> None:
    assert format_duration(seconds, exact=True) == expected


@given(st.integers(min_value=1, max_value=10**7), st.sampled_from([0, 0.5, 0.25]))
def test_format_duration_exact_parses_back(whole: int, fraction: float) -> None:
    seconds = whole + fraction
    assert parse_duration(format_duration(seconds, exact=True)) == pytest.approx(seconds)


@given(st.floats(min_value=0, max_value=100 * 86400 - 1))
def test_format_duration_in_a_table_is_at_most_six_characters(seconds: float) -> None:
    assert len(format_duration(seconds)) <= 6
