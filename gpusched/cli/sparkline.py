"""`gpusched show`'s two sparklines: a job's memory and utilization over time. No I/O.

`render_timeline()` turns the job's timeline (points oldest first, as the daemon stored
them: one per poll at first, then coarser) into three lines that fit the terminal's
width (80 columns at most): the memory, scaled so that a full block is the declared
memory or the peak, whichever is higher, with a legend saying which and where the other
sits; the utilization, a full block being 100 %; and when the samples span. Both lines
share one time axis, resampled to the columns there are: a column shows the highest
memory and the mean utilization of the points that fall in it, and a column no point
falls in repeats the one before (a point stands for the time until the next), unless
the points around it are far apart (`gap_threshold`): then it is blank, a gap.

Unicode blocks where the terminal's encoding can print them, else an ASCII ramp
(`glyphs_for`).
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timezone

from gpusched.core.units import format_duration, format_size

TYPE_CHECKING = False  # typing's own import costs every `gpusched show`
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    class TimelinePoint(Protocol):
        """What is read of a point: core/models.py's TimelinePoint, or show_view's
        TimelineView (a reply's point without the dataclass)."""

        @property
        def t(self) -> float: ...
        @property
        def memory_bytes(self) -> int | None: ...
        @property
        def utilization_pct(self) -> float | None: ...


BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_LEVELS = ".:-=+*#@"
NO_SAMPLE = " "  # a column with no figure (the driver gave no utilization)

LABEL_WIDTH = 11  # as `show`'s other rows: "memory:    "
MAX_WIDTH = 80
MIN_COLUMNS = 10
MAX_COLUMNS = 60

Column = tuple[int | None, float | None]  # (highest memory, mean utilization)


def glyphs_for(encoding: str | None) -> str:
    """BLOCKS if text in `encoding` can carry them, else ASCII_LEVELS."""
    try:
        BLOCKS.encode(encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_LEVELS
    return BLOCKS


def resample(points: Sequence[TimelinePoint], columns: int) -> list[Column]:
    """The points on `columns` equal slices of the time they span (fewer for one point)."""
    if not points:
        return []
    start, end = points[0].t, points[-1].t
    if len(points) == 1 or end <= start:
        return [_column(points)]
    slices: list[list[TimelinePoint]] = [[] for _ in range(columns)]
    for point in points:
        index = int((point.t - start) / (end - start) * columns)
        slices[min(columns - 1, max(0, index))].append(point)
    gaps = gaps_after(points)
    out: list[Column] = []
    drawn = 0  # how many points the columns so far hold
    for chosen in slices:
        if chosen:  # slice 0 holds the first point
            out.append(_column(chosen))
            drawn += len(chosen)
        elif drawn - 1 in gaps:
            out.append((None, None))  # no sample here: the daemon was stopped, say
        else:
            out.append(out[-1])
    return out


def gaps_after(points: Sequence[TimelinePoint]) -> set[int]:
    """The indices i with a gap between points[i] and points[i + 1]: a span more than three
    times as long as the spans beside it (the points grow coarser as a job runs long, so
    only the neighbours say what spacing to expect). Two points alone make no gap."""
    spans = [b.t - a.t for a, b in itertools.pairwise(points)]
    found = set()
    for i, span in enumerate(spans):
        beside = [spans[j] for j in (i - 1, i + 1) if 0 <= j < len(spans)]
        if beside and span > 3 * max(beside):
            found.add(i)
    return found


def _column(points: Sequence[TimelinePoint]) -> Column:
    memories = [p.memory_bytes for p in points if p.memory_bytes is not None]
    utils = [p.utilization_pct for p in points if p.utilization_pct is not None]
    return (
        max(memories) if memories else None,
        sum(utils) / len(utils) if utils else None,
    )


def level(value: float, top: float, glyphs: str) -> str:
    """The glyph of `value` on a scale where `top` is the full block."""
    if top <= 0:
        return glyphs[0]
    index = math.ceil(value / top * len(glyphs)) - 1
    return glyphs[min(len(glyphs) - 1, max(0, index))]


def sparkline(values: Sequence[float | None], top: float, glyphs: str) -> str:
    return "".join(NO_SAMPLE if v is None else level(v, top, glyphs) for v in values)


def render_timeline(
    points: Sequence[TimelinePoint],
    *,
    declared_bytes: int | None,
    gpus: int = 1,
    width: int = MAX_WIDTH,
    glyphs: str = BLOCKS,
) -> list[str]:
    """`show`'s lines for a job's timeline. `declared_bytes`: its --mem per GPU (None: a
    whole GPU); the memory points are summed over its `gpus` GPUs, so they are drawn
    against the declared size times `gpus`."""
    if not points:
        return [f"{'timeline:':<{LABEL_WIDTH}}no samples yet"]
    full = glyphs[-1]
    memories = [p.memory_bytes for p in points if p.memory_bytes is not None]
    peak = max(memories, default=0)
    declared = None if declared_bytes is None else declared_bytes * max(1, gpus)
    declared_text = None
    if declared is not None:
        declared_text = format_size(declared_bytes)
        if gpus > 1:
            declared_text = f"{gpus}x{declared_text}"
    if declared is not None and declared >= peak:
        top = declared
        mem_legend = f"{full} declared {declared_text}"
        note = f"peak {format_size(peak)}"
    else:
        top = peak
        mem_legend = f"{full} peak {format_size(peak)}"
        note = (
            "declared a whole GPU"
            if declared is None
            else (f"declared {declared_text} at {level(declared, top, glyphs)}")
        )
    summed = f" (sum of {gpus} GPUs)" if gpus > 1 else ""
    util_legend = f"{full} 100%"
    legend_width = max(len(mem_legend), len(util_legend))
    columns = min(width, MAX_WIDTH) - LABEL_WIDTH - 2 - legend_width
    columns = max(MIN_COLUMNS, min(MAX_COLUMNS, columns))
    sampled = resample(points, columns)
    mem_line = sparkline([m for m, _ in sampled], top, glyphs)
    util_line = sparkline([u for _, u in sampled], 100.0, glyphs)
    pad = len(mem_line) + 2
    lasted = format_duration(points[-1].t - points[0].t)
    began = datetime.fromtimestamp(points[0].t, timezone.utc)
    # The most that fits, said in that order of importance.
    said = [
        f"{note}{summed}; {lasted} from {began:%Y-%m-%d %H:%M} UTC",
        f"{note}{summed}; {lasted}",
        f"{note}; {lasted}",
        note,
    ]
    room = min(width, MAX_WIDTH) - LABEL_WIDTH
    when = next((text for text in said if len(text) <= room), said[-1])
    return [
        f"{'memory:':<{LABEL_WIDTH}}{mem_line:<{pad}}{mem_legend}",
        f"{'gpu busy:':<{LABEL_WIDTH}}{util_line:<{pad}}{util_legend}",
        f"{'':<{LABEL_WIDTH}}{when}",
    ]
