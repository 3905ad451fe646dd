"""Typed replies (gpusched.core.requests.replies, issue 23): one reply type per operation,
declared by its handler; one merge of two `status` pages for the CLI and the dashboard;
the CLI sends requests only as request objects; one base for the requests about one job.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from gpusched.core.errors import NotFoundError
from gpusched.core.requests.base import JobRequest
from gpusched.core.requests.catalog import REQUESTS
from gpusched.core.requests.replies import REPLIES, StatusPage
from gpusched.core.status_pages import merge_status_pages
from gpusched.daemon.handlers import HANDLERS

CLI = Path(__file__).resolve().parent.parent / "gpusched" / "cli"


def test_every_operation_has_one_reply_type_and_its_handler_returns_it() -> None:
    assert set(REPLIES) == set(REQUESTS) == set(HANDLERS)
    for op, handler in HANDLERS.items():
        declared = typing.get_type_hints(handler)["return"]
        assert declared == REPLIES[op], (op, declared, REPLIES[op])


def _page(jobs: list[int], counts: dict[str, int], **more: object) -> StatusPage:
    page: dict[str, typing.Any] = {
        "gpus": [{"index": 0}],
        "nodes": [{"name": "n1"}],
        "jobs": [{"id": i} for i in jobs],
        "drain": None,
        "next": None,
        "counts": counts,
    }
    page.update(more)
    return typing.cast(StatusPage, page)


def test_two_pages_merge_into_one_status() -> None:
    running = _page([1, 2], {"running": 2}, drain={"by": "root"})
    waiting = _page([5, 6], {"queued": 7, "held": 1, "running": 2}, gpus=[], nodes=[])
    view = merge_status_pages(running, waiting)
    assert view["gpus"] == [{"index": 0}]  # the running page's, whatever the other says
    assert view["nodes"] == [{"name": "n1"}]
    assert view["drain"] == {"by": "root"}
    assert view["counts"] == {"queued": 7, "held": 1, "running": 2}
    assert [j["id"] for j in view["running"]] == [1, 2]
    assert [j["id"] for j in view["waiting"]] == [5, 6]
    assert view["more_waiting"] == 6  # 8 waiting, 2 listed


def test_an_older_daemons_pages_without_nodes_drain_or_counts_still_merge() -> None:
    running = typing.cast(StatusPage, {"gpus": [], "jobs": [{"id": 1}]})
    waiting = typing.cast(StatusPage, {"gpus": [], "jobs": [{"id": 2}]})
    view = merge_status_pages(running, waiting)
    assert (view["nodes"], view["drain"], view["counts"], view["more_waiting"]) == ([], None, {}, 0)


def test_the_cli_sends_only_request_objects() -> None:
    """`client.request("op", ...)` skips the request's checks and its wire form; the CLI
    builds a request object and sends it (`client.send`) or calls a Client method. The
    fast path's frames are exempt, by name, each built without the request classes and
    proved equal to the request's wire form: `show` (show_view.show_wire) and `submit`
    (submitter.submit_frame, which runs SubmitRequest's own checks), both sent by
    cli/fast.py (tests/test_cli_fast_frames.py)."""
    exempt = {("fast.py", "show"), ("fast.py", "submit")}
    bypasses = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "request"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and (path.name, node.args[0].value) not in exempt
            ):
                bypasses.append(f"{path.name}:{node.lineno}")
    assert not bypasses


def _about_one_job(kind: type) -> bool:
    fields = {f.name: f for f in dataclasses.fields(kind)}
    return "id" in fields and typing.get_type_hints(kind)["id"] is int


@pytest.mark.parametrize("op", sorted(REQUESTS))
def test_a_request_about_one_job_is_a_job_request_and_refuses_id_zero(op: str) -> None:
    kind = REQUESTS[op]
    if not _about_one_job(kind):
        assert not issubclass(kind, JobRequest)
        return
    assert issubclass(kind, JobRequest)
    assert next(f.name for f in dataclasses.fields(kind)) == "id"  # `ShowRequest(7)`
    required = {
        f.name: 1
        for f in dataclasses.fields(kind)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    with pytest.raises(NotFoundError, match="no job 0"):
        kind(**{**required, "id": 0})
    assert kind(**required).id == 1
