"""Bounds on what one request may make the daemon build or store, checked before building.

A request is small (gpusched.core.requests.protocol caps a frame at 4 MiB) but what it asks for need
not be: a sweep multiplies its command by the product of its value lists, an environment
is stored with the jobs, a list of ids is looked up id by id. Each check here computes
the cost from the request alone and refuses, with one line naming the limit and its
config key, before anything of that size exists. The limits are the daemon's `Config`
(docs/operations.md lists every bound and its default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpusched.config.settings import Config
from gpusched.core.errors import UsageError
from gpusched.core.requests.sweep import ARG_OVERHEAD_BYTES, measure
from gpusched.core.units import format_size

# What the daemon builds of one reply that lists jobs (their JSON, estimated): below the
# protocol's MAX_REPLY_BYTES, so an answer too long is refused before it is all in memory.
REPLY_BUDGET = 32 * 2**20
_ID_BYTES = 21  # an id as stored in a JSON list: up to 19 digits, a sign and a comma


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def env_bytes(env: Mapping[str, str]) -> int:
    """An environment's size as the kernel counts it against ARG_MAX ("K=V\\0" and a pointer)."""
    return sum(_size(k) + _size(v) + 2 + 8 for k, v in env.items())


def check_env(env: Mapping[str, str], config: Config) -> None:
    size = env_bytes(env)
    if size > config.max_env_bytes:
        raise UsageError(
            f"the environment is {format_size(size)}, over the limit of"
            f" {format_size(config.max_env_bytes)} (max_env_bytes): unset large variables"
            " or pass a smaller one (Client.submit(env=...))"
        )


def reply_weight(job: Mapping[str, Any]) -> int:
    """About how many bytes of JSON one job of a reply is: its strings, plus the rest."""
    strings = [*(job.get("command") or ()), *(job.get("notify") or ()), *(job.get("hints") or ())]
    strings += [job.get("name"), job.get("cwd"), job.get("reason_detail")]
    strings += [job.get("waiting_reason"), job.get("log_path")]
    ids = len(job.get("after") or ())
    return 1024 + 24 * ids + sum(_json_len(text) for text in strings if isinstance(text, str))


def _json_len(text: str) -> int:
    """At most what json.dumps makes of `text` (ASCII escapes: up to 6 bytes a character)."""
    return len(text) + 2 if text.isascii() else 6 * len(text) + 2


def check_submit(
    config: Config,
    command: Sequence[str],
    sweep: Sequence[tuple[str, Sequence[str]]] | None,
    name: str | None,
    after: Sequence[int],
) -> None:
    """Refuse a submit whose jobs would be too many or too large, before expanding it.

    The bytes counted are what the jobs' rows hold per job: command (after substitution),
    name (with the sweep's label, before sweep.swept_name cuts it), dependency list; one
    job's command and dependency list are bounded apart (max_job_bytes), so that a
    user's rows are at most about max_queued x max_job_bytes on disk. The
    environment is stored once per submit (gpusched.store.schema `envs`) and checked apart
    (check_env).
    """
    if sweep is None:
        jobs = 1
        command_bytes = sum(_size(arg) + ARG_OVERHEAD_BYTES for arg in command)
        largest = command_bytes
        name_bytes = 0 if name is None else _size(name)
    else:
        size = measure(command, sweep)
        if size.jobs > config.max_array_jobs:
            raise UsageError(
                f"--sweep makes {size.jobs} jobs; one array holds at most"
                f" {config.max_array_jobs} (max_array_jobs)"
            )
        jobs, command_bytes, largest = size.jobs, size.command_bytes, size.largest_command
        name_bytes = size.label_bytes + (0 if name is None else jobs * _size(name + " "))
    total = command_bytes + name_bytes + jobs * len(after) * _ID_BYTES
    if total > config.max_submit_bytes:
        raise UsageError(
            f"this submit would store {format_size(total)} of commands, names and dependencies"
            f" for {jobs} job(s), over the limit of {format_size(config.max_submit_bytes)}"
            " (max_submit_bytes)"
        )
    one = largest + len(after) * _ID_BYTES
    if one > config.max_job_bytes:
        raise UsageError(
            f"a job's command and --after list would be {format_size(one)}, over the limit of"
            f" {format_size(config.max_job_bytes)} (max_job_bytes)"
        )
