"""A reply's objects as the CLI's screens read them: `ReplyView`, a job's or a GPU's JSON
read by attribute, as cli/render.py and cli/show_view.py read a `Job` or a `GpuReport`,
with every text it holds escaped (sanitize.shown) as the view is made; `job_view` and
`gpu_view`, with the models' defaults for the fields an older daemon does not send.

`gpusched status` and `show` draw from these, not from the models' dataclasses, so that
they start without creating them. Imports only sanitize: cli/status_view.py and
show_view.py make the views, cli/render.py and render_gpus.py import it only to
type-check what they draw.
"""

from __future__ import annotations

from gpusched.core.sanitize import shown

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:
    from typing import Any

# The defaults of core/models.py's Job and GpuReport for what render.py reads; a field
# both lack is an AttributeError, as on the dataclass.
_JOB_DEFAULTS: dict[str, Any] = {
    "state": "queued",
    "name": None,
    "mem": None,
    "gpus": 1,
    "gpu_indices": [],
    "command": [],
    "submitted_at": None,
    "started_at": None,
    "ended_at": None,
    "run_s": None,
    "exit_code": None,
    "reason": None,
    "reason_detail": None,
    "waiting_reason": None,
    "array_id": None,
    "array_index": None,
    "interactive": False,
    "warning": None,
    "mem_used": None,
}
_GPU_DEFAULTS: dict[str, Any] = {"error": None, "node": None, "short": 0, "others": []}


class ReplyView:
    """One object of a reply (a job, a GPU) read by attribute, its text already escaped."""

    def __init__(self, data: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.__dict__.update(defaults)
        for key, value in data.items():
            if isinstance(value, str):
                self.__dict__[key] = shown(value)
            elif isinstance(value, list) and value and isinstance(value[0], str):
                self.__dict__[key] = [shown(v) if isinstance(v, str) else v for v in value]
            else:
                self.__dict__[key] = value

    def __getattr__(self, name: str) -> Any:  # for mypy: the reply's fields are open
        raise AttributeError(name)


def job_view(data: dict[str, Any]) -> ReplyView:
    """A job of a reply as render.py reads it."""
    return ReplyView(data, _JOB_DEFAULTS)


def gpu_view(data: dict[str, Any]) -> ReplyView:
    """A GPU of a reply as render.py reads it."""
    return ReplyView(data, _GPU_DEFAULTS)
