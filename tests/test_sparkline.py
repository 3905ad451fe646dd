"""`gpusched show`'s sparklines (gpusched.cli.sparkline): scale, legend, resampling, width,
and the ASCII fallback, on timelines built here."""

from __future__ import annotations

import re

import pytest

from gpusched.cli.sparkline import (
    ASCII_LEVELS,
    BLOCKS,
    glyphs_for,
    level,
    render_timeline,
    resample,
)
from gpusched.core.models import TimelinePoint

GiB = 2**30
T0 = 1_735_689_600.0  # 2025-01-01 00:00 UTC


def steady(n: int, memory: int, util: float | None, step: float = 60.0) -> list[TimelinePoint]:
    return [TimelinePoint(T0 + i * step, memory, util) for i in range(n)]


def test_no_samples_is_one_line() -> None:
    assert render_timeline([], declared_bytes=8 * GiB) == ["timeline:  no samples yet"]


def test_under_its_declaration_the_full_block_is_the_declared_memory() -> None:
    points = steady(30, 5 * GiB, 100.0) + steady(30, 10 * GiB, 0.0)
    points = [TimelinePoint(T0 + i * 60, p.memory_bytes, p.utilization_pct)
              for i, p in enumerate(points)]  # fmt: skip
    memory, busy, when = render_timeline(points, declared_bytes=20 * GiB)
    assert memory.startswith("memory:    ▂")  # 5G of 20G: a quarter
    assert memory.endswith("▄  █ declared 20.0G")  # 10G: half
    assert set(memory[11:].rsplit("  █", 1)[0]) == {"▂", "▄"}
    assert busy.startswith("gpu busy:  ███")
    assert busy.endswith("▁▁▁  █ 100%")
    assert when == "           peak 10.0G; 59m from 2025-01-01 00:00 UTC"


def test_over_its_declaration_the_full_block_is_the_peak_and_declared_is_placed() -> None:
    points = steady(20, 8 * GiB, 50.0)
    memory, _, when = render_timeline(points, declared_bytes=6 * GiB)
    assert memory.endswith("█  █ peak 8.0G")
    assert level(6 * GiB, 8 * GiB, BLOCKS) == "▆"
    assert when.startswith("           declared 6.0G at ▆; 19m from")
    # A whole-GPU job has no declared line: the peak is the top.
    memory, _, when = render_timeline(points, declared_bytes=None)
    assert memory.endswith("█  █ peak 8.0G")
    assert when.startswith("           declared a whole GPU;")


def test_memory_on_several_gpus_is_drawn_against_the_declared_size_times_the_gpus() -> None:
    points = steady(10, 8 * GiB, 50.0)  # 4G on each of 2 GPUs
    memory, _, when = render_timeline(points, declared_bytes=4 * GiB, gpus=2)
    assert memory.endswith("█  █ declared 2x4.0G")
    assert "(sum of 2 GPUs)" in when


def test_no_utilization_leaves_gaps_and_zero_is_the_lowest_block() -> None:
    points = [TimelinePoint(T0, GiB, None), TimelinePoint(T0 + 60, GiB, 0.0)]
    _, busy, _ = render_timeline(points, declared_bytes=GiB)
    columns = busy[11:].rsplit("  █", 1)[0]
    assert set(columns) == {" ", "▁"}
    assert columns[0] == " "
    assert columns[-1] == "▁"


def test_resampling_follows_time_not_point_count() -> None:
    """One point per poll for five minutes, then one a minute: a column is a slice of time."""
    fine = [TimelinePoint(T0 + s, 2 * GiB, 100.0) for s in range(0, 300, 2)]
    coarse = [TimelinePoint(T0 + 300 + m * 60, 4 * GiB, 0.0) for m in range(96)]
    columns = resample(fine + coarse, 20)
    assert len(columns) == 20
    # 100 minutes in 20 columns: the first five minutes are the first column only.
    assert columns[0] == (2 * GiB, 100.0)
    assert all(c == (4 * GiB, 0.0) for c in columns[1:])
    # Within a column: the highest memory and the mean utilization.
    mixed = [TimelinePoint(T0, GiB, 20.0), TimelinePoint(T0 + 1, 3 * GiB, 60.0)]
    assert resample([*mixed, TimelinePoint(T0 + 100, GiB, 0.0)], 2) == [
        (3 * GiB, 40.0),
        (GiB, 0.0),
    ]
    # A column no point falls in repeats the one before (a point lasts until the next).
    sparse = [TimelinePoint(T0, GiB, 10.0), TimelinePoint(T0 + 100, 2 * GiB, 90.0)]
    assert resample(sparse, 5) == [(GiB, 10.0)] * 4 + [(2 * GiB, 90.0)]
    assert resample(sparse[:1], 5) == [(GiB, 10.0)]


@pytest.mark.parametrize("width", [50, 60, 80, 200])
@pytest.mark.parametrize(
    ("declared", "gpus", "peak"),
    [
        (20 * GiB, 1, 6 * GiB),
        (1023 * GiB, 8, 9000 * GiB),
        (None, 1, 80 * GiB),
        (512 * 2**20, 4, 100),
    ],
)
def test_every_line_fits_the_terminal_and_80_columns(
    width: int, declared: int | None, gpus: int, peak: int
) -> None:
    points = steady(1000, peak, 55.5, step=259.2)  # 72 hours
    lines = render_timeline(points, declared_bytes=declared, gpus=gpus, width=width)
    assert all(len(line) <= min(width, 80) for line in lines), lines
    assert len(lines) == 3
    assert len({line.rindex("  █ ") for line in lines[:2]}) == 1  # both legends line up


def test_ascii_where_the_terminal_cannot_print_blocks() -> None:
    assert glyphs_for("utf-8") == BLOCKS
    assert glyphs_for("UTF8") == BLOCKS
    for encoding in ("ascii", "ANSI_X3.4-1968", "latin-1", None, "no-such-codec"):
        assert glyphs_for(encoding) == ASCII_LEVELS
    points = steady(10, 4 * GiB, 100.0)
    lines = render_timeline(points, declared_bytes=8 * GiB, glyphs=ASCII_LEVELS)
    "\n".join(lines).encode("ascii")  # nothing it cannot print
    assert lines[0].endswith("=  @ declared 8.0G")  # half: the 4th of 8 levels
    assert lines[1].endswith("@  @ 100%")


def test_a_gap_in_the_samples_is_drawn_as_a_gap_not_a_line() -> None:
    """Points every 2 s, none for 60 s (the daemon was restarting), then every 2 s again:
    the columns in the hole are blank; a job whose points grow coarser has no gap."""
    before = [TimelinePoint(T0 + s, 2 * GiB, 50.0) for s in range(0, 60, 2)]
    after = [TimelinePoint(T0 + 120 + s, 4 * GiB, 80.0) for s in range(0, 60, 2)]
    columns = resample(before + after, 18)
    assert (None, None) in columns
    blank = [i for i, c in enumerate(columns) if c == (None, None)]
    assert blank == list(range(blank[0], blank[-1] + 1))  # one run, in the middle
    assert columns[0] == (2 * GiB, 50.0) and columns[-1] == (4 * GiB, 80.0)
    assert len(blank) >= 4  # 60 s of 178 s on 18 columns, give or take the edges
    lines = render_timeline(before + after, declared_bytes=8 * GiB)
    assert re.search(f"[{BLOCKS}] {{3,}}[{BLOCKS}]", lines[0]), lines[0]  # blank between
    coarse = [TimelinePoint(T0 + s, GiB, 1.0) for s in range(0, 300, 2)] + [
        TimelinePoint(T0 + 300 + m * 60, GiB, 1.0) for m in range(30)
    ]
    assert (None, None) not in resample(coarse, 40)
