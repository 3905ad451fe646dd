"""The GPU half of `gpusched status` (cli/render.py draws the rest): each card's memory bar,
figures and other users' processes, and the legend; data in, text out, no I/O.

The bar uses a different character per segment, so it reads without colour too; colour
(click.style) is imported only when colouring. Every text field is passed through
`sanitize.shown` first, and the columns are measured on what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.core.sanitize import shown, shown_fields
from gpusched.core.units import format_size

TYPE_CHECKING = False  # typing's own costs every `gpusched status` its import
if TYPE_CHECKING:
    from typing import TypeAlias

    from gpusched.cli.reply_view import ReplyView
    from gpusched.core.models import GpuReport

    GpuLike: TypeAlias = GpuReport | ReplyView

MIN_BAR = 8
MAX_BAR = 50

# One character per memory segment, so the bar reads without colour too.
BAR_JOBS = "#"
BAR_OTHERS = "%"
BAR_RESERVED = "+"
BAR_FREE = "."

_SEGMENT_COLORS = {
    BAR_JOBS: "green",
    BAR_OTHERS: "magenta",
    BAR_RESERVED: "yellow",
    BAR_FREE: None,
}


class Painter:
    """click.style when colouring, identity otherwise."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, fg: str | None = None, **styles: bool) -> str:
        if not self.color or (fg is None and not styles):
            return text
        import click  # on a terminal only: a pipe's `status` starts without it

        return click.style(text, fg=fg, **styles)


def split_cells(values: Sequence[int], cells: int) -> list[int]:
    """Share `cells` characters among `values` in proportion, every non-zero value getting
    at least one cell when there are enough cells; the counts always sum to `cells`."""
    total = sum(max(0, v) for v in values)
    if cells <= 0:
        return [0] * len(values)
    if total <= 0:
        return [0] * (len(values) - 1) + [cells]
    # Cumulative rounding: the boundaries fall where the bytes do, and the sum is exact.
    counts = []
    running = 0
    previous = 0
    for value in values:
        running += max(0, value)
        boundary = round(running * cells / total)
        counts.append(boundary - previous)
        previous = boundary
    # A sliver (e.g. 300M of another user's process on an 80G card) must still show.
    for i, value in enumerate(values):
        if value > 0 and counts[i] == 0:
            donor = max(range(len(counts)), key=lambda j: counts[j])
            if counts[donor] > 1:
                counts[donor] -= 1
                counts[i] = 1
    return counts


def memory_bar(gpu: GpuLike, cells: int, paint: Painter) -> str:
    """[###%%++......]: gpusched jobs, other processes, reserved for jobs, free."""
    jobs = max(0, gpu.used_by_jobs)
    others = max(0, gpu.used_by_others)
    reserved = max(0, gpu.reserved)
    free = max(0, gpu.total - jobs - others - reserved)
    counts = split_cells([jobs, others, reserved, free], cells)
    parts = [
        paint(char * count, _SEGMENT_COLORS[char], **({"dim": True} if char == BAR_FREE else {}))
        for char, count in zip((BAR_JOBS, BAR_OTHERS, BAR_RESERVED, BAR_FREE), counts, strict=True)
        if count
    ]
    return "[" + "".join(parts) + "]"


def clip(text: str, width: int, marker: str = "...") -> str:
    """`text` cut to `width` characters, ending with `marker` when cut."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - len(marker)] + marker if width > len(marker) else text[:width]


def _gpu_columns(width: int) -> tuple[int, int]:
    """(name width, bar cells) for a terminal `width` columns wide."""
    name = 20 if width >= 100 else 14 if width >= 80 else 10
    # index 3, spaces, name, [bar], used/total 13, available 10, util 5
    bar = width - (3 + 1 + name + 1 + 2 + 14 + 10 + 5) - 1
    return name, min(MAX_BAR, max(MIN_BAR, bar))


def render_gpus(gpus: Sequence[GpuLike], width: int = 80, color: bool = False) -> list[str]:
    paint = Painter(color)
    gpus = [shown_fields(gpu) for gpu in gpus]
    name_w, cells = _gpu_columns(width)
    bar_w = cells + 2
    lines = [
        paint(
            f"{'GPU':>3} {'NAME':<{name_w}} {'MEMORY':<{bar_w}}"
            f" {'USED/TOTAL':>13} {'AVAILABLE':>9} {'UTIL':>4}",
            bold=True,
        )
    ]
    for gpu in gpus:
        # "NVIDIA A100-SXM4-80GB": every card here is NVIDIA's; the model is what tells them apart.
        name = clip(gpu.name.removeprefix("NVIDIA "), name_w, "+")
        if gpu.state == "ok":
            bar = memory_bar(gpu, cells, paint)
            used = f"{format_size(gpu.used)}/{format_size(gpu.total)}"
            util = "-" if gpu.util is None else f"{gpu.util}%"
            tail = f" {used:>13} {format_size(gpu.available):>9} {util:>4}"
        else:
            why = f"{gpu.state}: {gpu.error}" if gpu.error else str(gpu.state)
            bar = paint(f"{clip(why, bar_w):<{bar_w}}", "red" if gpu.state == "lost" else None)
            tail = f" {'-/' + format_size(gpu.total):>13} {'-':>9} {'-':>4}"
        lines.append(f"{gpu.index:>3} {name:<{name_w}} {bar}{tail}")
        if gpu.state == "ok" and gpu.short > 0:  # its bar cannot show what is missing
            lines.append(
                paint(
                    f"{'':>3} GPU {gpu.index} is {format_size(gpu.short, tabular=False)} short of"
                    " its jobs' reservations: a job there may run out of memory",
                    "red",
                )
            )
        if gpu.others:  # memory outside gpusched, said whose (as gpustat does)
            indent = " " * (3 + 1 + name_w + 1)
            listed = ", ".join(outside_process(p) for p in gpu.others)
            lines.append(indent + clip(f"others: {listed}", width - len(indent)))
    if gpus:
        lines.append(_legend(width, 3 + 1 + name_w + 1, paint))
    return lines


def outside_process(process: dict[str, object]) -> str:
    """`bob:python3/4242(10G)`: owner, program, pid and memory, as gpustat shows them."""
    user = shown(str(process.get("user") or "?"))
    command = shown(str(process.get("command") or "?"))
    used = process.get("used")
    size = format_size(used, tabular=False) if isinstance(used, int) else "?"
    return f"{user}:{command}/{process.get('pid')}({size})"


def _legend(width: int, indent: int, paint: Painter) -> str:
    """What the bar's characters mean, under the bars (shorter on a narrow terminal)."""
    words = ("gpusched jobs", "other processes", "reserved", "free")
    if indent + 54 > width:
        words = ("jobs", "others", "reserved", "free")
        indent = min(indent, max(0, width - 34))
    chars = (BAR_JOBS, BAR_OTHERS, BAR_RESERVED, BAR_FREE)
    items = [
        paint(c, _SEGMENT_COLORS[c], **({"dim": True} if c == BAR_FREE else {})) + " " + w
        for c, w in zip(chars, words, strict=True)
    ]
    return " " * indent + "  ".join(items)
