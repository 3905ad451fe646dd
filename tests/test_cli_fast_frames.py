"""The fast path's frames and JSON are the request classes' and the models' (issue 30).

`gpusched show` and `submit` answered by cli/fast.py build neither the request dataclasses
nor the models' `Job`/`TimelinePoint`: they send a frame made by a function and print the
reply's JSON through plain tables. Each of those is checked here against the dataclass it
stands for, on the same inputs: the frame (`show_wire`, `submit_frame` against
`ShowRequest`/`SubmitRequest(...).to_wire()`), a submit's refusals (the same error, the
same words), the JOB object (`job_json` against `Job.from_json(...).to_json()`), a
timeline point, and the tables of fields and defaults themselves. tests/test_cli_fast.py
runs both paths as processes against a daemon.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpusched.cli.job_json import JOB_DEFAULTS, JOB_REQUIRED, job_json
from gpusched.cli.show_view import TimelineView, show_json, show_wire
from gpusched.core.errors import GpuschedError
from gpusched.core.models import Job, TimelinePoint
from gpusched.core.requests.catalog import SubmitRequest
from gpusched.core.requests.views import ShowRequest
from gpusched.submitter import SUBMIT_DEFAULTS, submit_fields, submit_frame

G = 2**30


def _defaults(kind: type) -> tuple[tuple[str, ...], dict[str, Any]]:
    required, defaults = [], {}
    for each in dataclasses.fields(kind):
        if each.default is not dataclasses.MISSING:
            defaults[each.name] = each.default
        elif each.default_factory is not dataclasses.MISSING:
            defaults[each.name] = each.default_factory()
        else:
            required.append(each.name)
    return tuple(required), defaults


def test_the_job_table_is_jobs_fields_in_order() -> None:
    required, defaults = _defaults(Job)
    assert required == JOB_REQUIRED
    assert list(JOB_DEFAULTS) == list(defaults)  # the order the JSON is printed in
    assert {**defaults, "state": str(defaults["state"])} == JOB_DEFAULTS


JOB_REPLIES = [
    {"id": 1, "user": "a", "uid": 5, "command": ["true"], "cwd": "/"},  # an older daemon's
    {
        "id": 2,
        "user": "b\x1b",
        "uid": 6,
        "command": ["x", "y"],
        "cwd": "/w",
        "state": "running",
        "gpu_indices": [0, 1],
        "hints": ["h"],
        "notify_result": {"kind": "exit", "exit_code": 0, "output": ""},
        "attempts": [{"attempt": 1, "node": None, "outcome": "lost"}],
        "sharing_speed": 0.5,
        "a_newer_field": 3,  # not Job's: dropped, as Job.from_json drops it
    },
]


@pytest.mark.parametrize("reply", JOB_REPLIES)
def test_job_json_is_jobs_round_trip(reply: dict[str, Any]) -> None:
    expected = Job.from_json(reply).to_json()
    assert job_json(reply) == expected
    assert list(job_json(reply)) == list(expected)  # key order too: `--json` prints it


POINTS: list[dict[str, Any]] = [
    {"t": "2026-11-01T10:00:00.000+00:00", "memory": 100, "util": 50},  # an int util
    {"t": "2026-11-01T10:00:05.5+00:00", "memory": None, "util": None},
    {"t": "2026-11-01T10:01:00+02:00", "memory": 2 * G, "util": 99.5},  # another zone
]


@pytest.mark.parametrize("point", POINTS)
def test_a_timeline_point_reads_and_writes_as_timelinepoint(point: dict[str, Any]) -> None:
    model, view = TimelinePoint.from_json(point), TimelineView(point)
    assert (view.t, view.memory_bytes, view.utilization_pct) == (
        model.t,
        model.memory_bytes,
        model.utilization_pct,
    )
    assert view.to_json() == model.to_json()


def test_show_json_is_the_models() -> None:
    reply = {**JOB_REPLIES[1], "timeline": POINTS}
    expected = {
        **Job.from_json(reply).to_json(),
        "timeline": [TimelinePoint.from_json(p).to_json() for p in POINTS],
    }
    assert show_json(reply) == json.dumps(expected, indent=2, sort_keys=False)


@pytest.mark.parametrize("job_id", [1, 42, 10**12])
def test_the_show_frame_is_the_requests(job_id: int) -> None:
    assert {"op": "show", **show_wire(job_id)} == ShowRequest(job_id, timeline=True).to_wire()


def test_a_show_frame_refuses_what_the_request_refuses() -> None:
    with pytest.raises(GpuschedError) as frame:
        show_wire(0)
    with pytest.raises(GpuschedError) as request:
        ShowRequest(0, timeline=True)
    assert (type(frame.value), str(frame.value)) == (type(request.value), str(request.value))


def test_the_submit_defaults_are_the_requests() -> None:
    required, defaults = _defaults(SubmitRequest)
    assert {k: v for k, v in defaults.items() if k in SUBMIT_DEFAULTS} == SUBMIT_DEFAULTS
    # Every field is either a default here or always given by submit_fields.
    given = set(submit_fields(["true"], suggested_mem=_never, cwd="/"))
    assert set(required) | set(defaults) == given | set(SUBMIT_DEFAULTS)


def _never(argv: tuple[str, ...]) -> int:
    raise AssertionError(argv)


SUBMITS: list[dict[str, Any]] = [
    {},
    {"mem": "1G", "gpus": 2, "name": "n\x1b", "hold": True, "time_limit": "1h"},
    {"mem": 3 * G, "after": [3, 3, 1], "notify": "echo 'a b'", "priority": 5, "retry_oom": 2},
    {"nodes": ("gpu1", "gpu2"), "requeue": True, "exclusive": True, "output": "o-{id}.log"},
    {"share": True, "env": {"PATH": "/bin", "X": "1"}, "time_limit": 90.5},
    {"sweep": (("lr", ("0.1", "0.01")),), "max_concurrent": 1, "request_id": "a" * 32},
]


@pytest.mark.parametrize("options", SUBMITS)
def test_the_submit_frame_is_the_requests(options: dict[str, Any]) -> None:
    fields = submit_fields(["/bin/echo", "{lr}"], suggested_mem=_never, cwd="/", **options)
    assert {"op": "submit", **submit_frame(dict(fields))} == SubmitRequest(**fields).to_wire()


def test_an_empty_notify_is_none_in_both() -> None:
    fields = {**submit_fields(["/bin/true"], suggested_mem=_never, cwd="/"), "notify": ()}
    assert submit_frame(dict(fields))["notify"] is None
    assert SubmitRequest(**fields).to_wire()["notify"] is None


# Fields as the request takes them (submit_fields parses sizes and durations first).
REFUSED: list[dict[str, Any]] = [
    {"gpus": 0},
    {"mem": 100 * 2**20},
    {"mem": 0},
    {"name": "n" * 201},
    {"time": 0.01},
    {"time": 1e10},
    {"time": -1.0},
    {"command": ("",)},
    {"cwd": "relative"},
    {"max_concurrent": 2},  # without a sweep
    {"sweep": (("a", ("1",)),), "max_concurrent": 0},
    {"nodes": ("bad name",)},
    {"nodes": ()},
    {"exclusive": True, "share": True},
    {"retry_oom": 11},
    {"notify": ("x",) * 300},
    {"notify": ("", "x")},
    {"after": tuple(range(10_001))},
    {"request_id": "short"},
    {"umask": 0o1000},
]


@pytest.mark.parametrize("options", REFUSED)
def test_a_submit_frame_refuses_what_the_request_refuses(options: dict[str, Any]) -> None:
    fields = {**submit_fields(["/bin/true"], suggested_mem=_never, cwd="/"), **options}
    with pytest.raises(GpuschedError) as request:
        SubmitRequest(**fields)
    with pytest.raises(GpuschedError) as frame:
        submit_frame(dict(fields))
    assert (type(frame.value), str(frame.value)) == (type(request.value), str(request.value))


@pytest.mark.parametrize("name", ["sh", "python3", "no-such-program", "/bin/sh", "./x", "bin", "x"])
@pytest.mark.parametrize("path", [None, "", "{tmp}", "{tmp}:/usr/bin:/bin:{tmp}", "/nowhere"])
def test_the_submitters_which_is_shutils(name: str, path: str | None, tmp_path: Any) -> None:
    """The program lookup a submit makes without importing shutil finds what shutil finds:
    an executable file, never a directory or a file without its x bit."""
    import os
    import shutil

    from gpusched.submitter import which

    (tmp_path / "bin").mkdir()  # a directory named like a program
    (tmp_path / "x").write_text("")  # not executable
    (tmp_path / "sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "sh", 0o700)  # found first when tmp comes first
    search = None if path is None else path.format(tmp=tmp_path)
    assert which(name, search) == shutil.which(name, path=search)


@pytest.mark.parametrize("unit", ["B", "K", "M", "G", "T", "Gi", "GiB"])
@pytest.mark.parametrize("number", ["1", "007", "512", "8", "0", "2000000000"])
def test_a_whole_size_parses_as_its_decimal_form(number: str, unit: str) -> None:
    """A whole number of units is read without the decimal module: the same bytes, or the
    same refusal, as the number written with a fraction."""
    from gpusched.core.units import parse_size

    def outcome(text: str) -> Any:
        try:
            return parse_size(text, what="--mem")
        except GpuschedError as exc:
            return str(exc).replace(f"{number}.0", number)

    assert outcome(f"{number}{unit}") == outcome(f"{number}.0{unit}")
