"""`gpusched status` rendering on fixed data: golden text at 80 columns, with and without colour.

Regenerate the golden files after an intended change with
GPUSCHED_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py, and review the diff.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import click
import pytest

from gpusched.cli.history_view import history_lines
from gpusched.cli.render import format_indices, render_status
from gpusched.cli.render_gpus import split_cells
from gpusched.core.models import GpuReport, Job, JobState
from gpusched.core.units import format_duration

GOLDEN = Path(__file__).parent / "golden"
G = 2**30
M = 2**20
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def _at(hhmmss: str) -> str:
    return f"2026-05-01T{hhmmss}.000+00:00"


def gpus() -> list[GpuReport]:
    return [
        # Two gpusched jobs (40G used, 10G still reserved), 10G of someone else's process.
        GpuReport(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 80 * G, 50 * G, 30 * G, 10 * G,
                  19 * G + 512 * M, 40 * G, 10 * G, 87, "ok", [2, 3]),
        GpuReport(1, "GPU-b", "NVIDIA A100-SXM4-80GB", 80 * G, 300 * M, 80 * G - 300 * M, 0,
                  79 * G + 212 * M, 0, 300 * M, 0, "ok", [3]),
        GpuReport(2, "GPU-c", "NVIDIA A100-SXM4-80GB", 80 * G, 0, 0, 0, 0, 0, 0, None, "lost",
                  [], "NVML: GPU is lost"),
    ]  # fmt: skip


def jobs() -> list[Job]:
    return [
        Job(2, "alice", 1001, ["python", "train.py"], "/h", JobState.RUNNING,
            name="resnet50-sweep-lr0.1", mem=20 * G, gpu_indices=[0],
            submitted_at=_at("10:00:00"), started_at=_at("10:57:00")),
        Job(3, "bob", 1002, ["python", "/home/bob/projects/very/long/path/to/train_gpt.py",
                             "--epochs", "100", "--lr", "3e-4"], "/h", JobState.RUNNING,
            mem=20 * G, gpus=2, gpu_indices=[0, 1],
            submitted_at=_at("11:00:00"), started_at=_at("11:59:15")),
        Job(4, "carol", 1003, ["python", "x.py"], "/h", JobState.QUEUED, mem=60 * G,
            submitted_at=_at("11:48:00"),
            waiting_reason="needs 60.0G on 1 GPU, most available is 19.5G on GPU 0"),
        Job(5, "carol", 1003, ["python", "y.py"], "/h", JobState.HELD, mem=None,
            submitted_at="2026-04-29T11:48:00.000+00:00",
            waiting_reason="held: release it with `gpusched release`"),
        Job(1, "alice", 1001, ["python", "z.py"], "/h", JobState.DONE, mem=8 * G,
            gpu_indices=[1], submitted_at=_at("09:00:00"), started_at=_at("09:00:01"),
            ended_at=_at("09:20:01"), exit_code=0, reason="exit"),
        Job(6, "daniel.longname", 1004, ["python", "z.py"], "/h", JobState.FAILED, mem=8 * G,
            gpu_indices=[1], submitted_at=_at("09:00:00"), started_at=_at("09:00:01"),
            ended_at=_at("09:00:31"), exit_code=137, reason="signal",
            reason_detail="killed by SIGKILL"),
    ]  # fmt: skip


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUSCHED_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text()


def test_status_at_80_columns_without_colour_matches_golden() -> None:
    text = render_status(gpus(), jobs(), width=80, now=NOW, show_all=True)
    _golden("status_80.txt", text)
    assert "\x1b[" not in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_status_at_80_columns_with_colour_matches_golden_and_only_adds_colour() -> None:
    plain = render_status(gpus(), jobs(), width=80, now=NOW, show_all=True)
    colored = render_status(gpus(), jobs(), width=80, now=NOW, show_all=True, color=True)
    _golden("status_80_color.txt", colored)
    assert "\x1b[" in colored
    assert click.unstyle(colored) == plain


@pytest.mark.parametrize("width", [60, 72, 80, 100, 132, 200])
def test_every_line_fits_the_width(width: int) -> None:
    text = render_status(gpus(), jobs(), width=width, now=NOW, show_all=True)
    assert max(len(line) for line in text.splitlines()) <= width


def test_no_jobs_and_no_ended_jobs_say_so() -> None:
    text = render_status(gpus()[:1], [], width=80, now=NOW)
    assert text.splitlines()[-1] == "no jobs (--all shows recently ended ones)"
    running_only = render_status(gpus(), jobs()[:1], width=80, now=NOW)
    assert "recently ended" not in running_only and "waiting" not in running_only


def test_memory_bar_segments_follow_the_bytes() -> None:
    line = render_status(gpus(), [], width=80, now=NOW).splitlines()[1]
    bar = line[line.index("[") + 1 : line.index("]")]
    # 40G jobs, 10G others, 10G reserved, 20G free of 80G, over the bar's cells.
    cells = len(bar)
    assert bar.count("#") == round(cells * 40 / 80)
    assert bar == "".join(sorted(bar, key="#%+.".index))
    # GPU 1: a 300M process of another user still shows as one cell.
    line1 = render_status(gpus(), [], width=80, now=NOW).splitlines()[2]
    assert line1[line1.index("[") + 1 : line1.index("]")].count("%") == 1


def test_split_cells_sums_exactly_and_shows_slivers() -> None:
    assert split_cells([1, 1, 1, 1], 8) == [2, 2, 2, 2]
    assert split_cells([0, 0, 0, 0], 7) == [0, 0, 0, 7]
    assert split_cells([100 * G, 1, 0, 0], 10) == [9, 1, 0, 0]
    for values in ([5, 3, 2, 90], [1, 2, 3, 4], [80, 0, 0, 0]):
        for cells in (1, 8, 29, 50):
            assert sum(split_cells(values, cells)) == cells


def test_durations_and_gpu_lists_are_short() -> None:
    assert [format_duration(s) for s in (0, 59, 60, 3599, 3600, 3661, 86400 * 3 + 3600 * 4)] == [
        "0s",
        "59s",
        "1m",
        "59m",
        "1h00m",
        "1h01m",
        "3d04h",
    ]
    assert format_indices([]) == "-"
    assert format_indices([3, 0, 1, 2]) == "0-3"
    assert format_indices([0, 1, 4]) == "0,1,4"
    assert format_indices([0, 2, 3, 4, 7]) == "0,2-4,7"


def test_a_cluster_shows_each_node_with_its_gpus_and_one_server_shows_none() -> None:
    from gpusched.core.models import NodeStatus

    a, b = gpus()[:2], gpus()[2:]
    nodes = [NodeStatus("gpu1", "up", 0.4, a), NodeStatus("gpu2\x1b[31m", "down", 95.0, b)]
    text = render_status(gpus(), jobs(), width=80, now=NOW, nodes=nodes)
    lines = text.splitlines()
    first = lines.index("node gpu1: up, heard 0s ago, 2 GPU(s)")
    second = next(i for i, line in enumerate(lines) if line.startswith("node gpu2"))
    assert first < second
    assert lines[second] == "node gpu2\\x1b[31m: down, heard 1m ago, 1 GPU(s)"  # escaped
    assert "NVML: GPU is lost" in "\n".join(lines[second:])  # its GPUs under it
    one = render_status(gpus(), jobs(), width=80, now=NOW, nodes=[nodes[0]])
    assert one == render_status(gpus(), jobs(), width=80, now=NOW)  # one server: as before


def test_an_idle_interactive_job_shows_its_warning_under_it() -> None:
    idle = Job(7, "erin", 1005, ["bash"], "/h", JobState.RUNNING, mem=8 * G, gpu_indices=[1],
               submitted_at=_at("11:00:00"), started_at=_at("11:00:01"), interactive=True,
               warning="idle: no GPU use for 1h (interactive.idle_timeout 1h)")  # fmt: skip
    lines = render_status(gpus(), [idle], width=80, now=NOW).splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["7", "erin"])
    assert lines[at + 1].strip() == "idle: no GPU use for 1h (interactive.idle_timeout 1h)"


def test_a_long_script_path_loses_its_directories_before_the_script_name() -> None:
    long_path = ["python", "/home/bob/projects/very/long/path/to/the/experiments/train_gpt.py"]
    job = Job(3, "bob", 1002, [*long_path, "--epochs", "100", "--lr", "3e-4"], "/h",
              JobState.RUNNING, mem=20 * G, gpu_indices=[0], submitted_at=_at("11:00:00"),
              started_at=_at("11:59:15"))  # fmt: skip
    for width in (72, 80):
        line = next(
            x for x in render_status(gpus(), [job], width=width, now=NOW).splitlines()
            if x.split()[:1] == ["3"]
        )  # fmt: skip
        assert len(line) <= width
        assert ".../train_gpt.py" in line
    wide = render_status(gpus(), [job], width=200, now=NOW)
    assert "/home/bob/projects/very/long/path/to/the/experiments/train_gpt.py" in wide


@pytest.mark.parametrize(
    ("command", "script"),
    [
        (["/home/alice/venvs/torch/bin/python", "train.py", "--lr", "0.1"], "train.py"),
        (["/opt/conda/envs/pytorch-2.3-cuda12/bin/python3.11", "finetune_llama.py", "--lr",
          "0.1"], "finetune_llama.py"),
        (["python", "z.py"], "z.py"),
    ],
)  # fmt: skip
def test_at_80_columns_the_cut_never_takes_the_scripts_name(
    command: list[str], script: str
) -> None:
    """A running job, and an ended one whose label takes room from it: each row keeps the
    name of the script its interpreter runs; so does history's narrower column (the
    golden files: "failed (killed by SIGKILL): z.py")."""
    at, began = _at("11:00:00"), _at("11:59:15")
    rows = [
        Job(3, "alice", 1001, command, "/h", JobState.RUNNING, mem=16 * G, mem_used=16 * G,
            gpu_indices=[0, 1], submitted_at=at, started_at=began),
        Job(4, "alice", 1001, command, "/h", JobState.FAILED, mem=16 * G, exit_code=1,
            reason="exit", gpu_indices=[0, 1], submitted_at=at, started_at=began,
            ended_at=_at("11:59:45")),
    ]  # fmt: skip
    lines = render_status(gpus(), rows, width=80, now=NOW).splitlines()
    for job in rows:
        line = next(x for x in lines if x.split()[:1] == [str(job.id)])
        assert len(line) <= 80, line
        assert {script, f"{script}+"} & set(line.split()), line
    # history's columns leave a command 10 characters at 80: a longer name is cut there.
    for line in history_lines(rows, 80)[1:] if len(script) < 10 else []:
        assert {script, f"{script}+"} & set(line.split()), line


def test_a_limit_reason_is_wrapped_so_the_limits_name_stays() -> None:
    reason = "user limit: carol holds 60.0G of GPU memory and this job needs 20.0G (max_mem 64.0G)"
    job = Job(4, "carol", 1003, ["python", "x.py"], "/h", JobState.QUEUED, mem=20 * G,
              submitted_at=_at("11:48:00"), waiting_reason=reason)  # fmt: skip
    for width in (60, 80):
        lines = render_status(gpus(), [job], width=width, now=NOW).splitlines()
        assert all(len(line) <= width for line in lines)
        at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["4"])
        note = " ".join(line.strip() for line in lines[at + 1 : at + 4] if line.startswith(" " * 8))
        assert note == reason


def test_others_hidden_sweep_and_interactive_jobs_show_their_array_and_mark() -> None:
    swept = Job(
        8,
        "bob",
        1002,
        ["(hidden)"],
        "",
        JobState.RUNNING,
        mem=4 * G,
        gpu_indices=[1],
        array_id=3,
        array_index=2,
        started_at=_at("11:00:00"),
    )
    interactive = Job(9, "bob", 1002, ["(hidden)"], "", JobState.RUNNING, mem=4 * G,
                      gpu_indices=[1], interactive=True, started_at=_at("11:00:00"))  # fmt: skip
    text = render_status(gpus(), [swept, interactive], width=80, now=NOW)
    assert "a3[2] (hidden)" in text
    assert "(interactive) (hidden)" in text


def test_a_running_job_shows_the_memory_it_uses_beside_what_it_declared() -> None:
    over = Job(
        10,
        "dan",
        1004,
        ["python", "big.py"],
        "/h",
        JobState.RUNNING,
        mem=4 * G,
        gpu_indices=[0],
        started_at=_at("11:00:00"),
        mem_used=10 * G + 800 * M,
    )
    queued = Job(11, "dan", 1004, ["python", "q.py"], "/h", JobState.QUEUED, mem=4 * G,
                 submitted_at=_at("11:00:00"))  # fmt: skip
    text = render_status(gpus(), [over, queued], width=80, now=NOW)
    row = next(x for x in text.splitlines() if x.split()[:1] == ["10"])
    assert "10.8G/4.0G" in row
    queued_row = next(x for x in text.splitlines() if x.split()[:1] == ["11"])
    assert "/" not in queued_row.split("python")[0]  # nothing in use to show yet


def test_a_drain_on_one_server_speaks_of_the_server_and_not_of_undrain() -> None:
    from gpusched.core.models import Drain, NodeStatus

    drain = Drain("root", "2026-05-01T08:00:00.000+00:00", "new fans")
    one = [NodeStatus("gpu1", "drained", 0.2, gpus())]
    text = render_status(gpus(), jobs(), width=80, now=NOW, drain=drain, nodes=one)
    assert "undrain" not in text
    assert "node gpu1" not in text  # one server: no cluster's node lines
    assert "draining since 2026-05-01 08:00 UTC (by root: new fans)" in text
    assert "administrator" in text


def test_a_reply_drawn_from_its_json_reads_as_from_the_models() -> None:
    """`gpusched status` draws from plain views of the reply (cli/reply_view.py), not from
    the dataclasses: the same screen, users' control characters escaped the same way."""
    from gpusched.cli.reply_view import gpu_view, job_view

    hostile = Job(7, "mallory", 1005, ["python", "a\x1b[2Jb.py", "x\ny"], "/h", JobState.QUEUED,
                  name=None, mem=8 * G, submitted_at=_at("11:00:00"),
                  waiting_reason="waits\rfor\u202egpu")  # fmt: skip
    named = Job(8, "eve\x1b]0;", 1006, ["true"], "/h", JobState.HELD, name="n\x9bame",
                submitted_at=_at("11:00:00"))  # fmt: skip
    models, views = (
        [*jobs(), hostile, named],
        [job_view(j.to_json()) for j in [*jobs(), hostile, named]],
    )
    for color in (False, True):
        from_models = render_status(gpus(), models, width=100, now=NOW, show_all=True, color=color)
        from_views = render_status(
            [gpu_view(g.to_json()) for g in gpus()], views, width=100, now=NOW, show_all=True,
            color=color,
        )  # fmt: skip
        assert from_views == from_models
    assert "a\\x1b[2Jb.py" in from_views and "\x1b[2J" not in from_views
    assert "eve\\x1b]0;" in from_views and "n\\x9bame" in from_views


def test_the_state_names_render_and_status_use_are_the_models() -> None:
    from gpusched.cli import render
    from gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES
    from gpusched.core.status_pages import ENDED_STATE_NAMES

    ended = {str(state) for state in TERMINAL_STATES}
    assert render.ENDED_STATES == ENDED_STATE_NAMES == ended
    assert render.WAITING_STATES | {render.RUNNING} == {str(state) for state in ACTIVE_STATES}
    assert set(render._STATE_COLORS) == ended | {str(state) for state in ACTIVE_STATES}
