"""`submit --output PATH`: where a job's log goes instead of `log_dir/ID.log`.

The path is a template: `{id}` becomes the job's id, `{array}` its sweep's id and
`{index}` its 0-based index in the sweep (outside a sweep: the job's id and 0); any other
text, braces included, is kept as written. A relative path is taken from the submit's
working directory. The placeholders go in the file name only, so the directory checked
at submit (as the user: they must be able to create files in it) is the one used; a
sweep's template must hold `{id}` or `{index}`, so that its jobs do not share one file.

Safety: the supervisor opens this file as the job's owner (effective uid, gid and groups
dropped), with O_NOFOLLOW|O_NONBLOCK, and accepts only a regular file that the owner
owns; every later read or append by the daemon (`gpusched logs`, OOM detection, its
notes) checks the same (gpusched.usage.joblog.open_log). So naming another user's file,
or a symlink to /etc/shadow, gets nothing opened as root. Retention never deletes such a
file: it is the user's, outside `log_dir`.
"""

from __future__ import annotations

import os

from gpusched.core.errors import UsageError
from gpusched.core.models import Job

PLACEHOLDERS = ("{id}", "{array}", "{index}")
MAX_OUTPUT_CHARS = 4096  # PATH_MAX


def output_template(output: str, cwd: str, sweep: bool) -> str:
    """The template to store for `--output OUTPUT` given at `cwd`; UsageError if unusable."""
    if not output or "\0" in output or len(output) > MAX_OUTPUT_CHARS:
        raise UsageError("--output: expected a file path")
    template = output if output.startswith("/") else os.path.join(cwd, output)
    directory, name = os.path.split(template)
    if name in ("", ".", ".."):
        raise UsageError(f"--output {output}: expected a file name, not a directory")
    if any(mark in directory for mark in PLACEHOLDERS):
        raise UsageError(f"--output {output}: {{id}}, {{array}} and {{index}} go in the file name")
    if sweep and "{id}" not in name and "{index}" not in name:
        raise UsageError(
            f"--output {output}: a sweep's jobs would share one file: put {{id}} or {{index}}"
            " in the file name"
        )
    return template


def output_directory(template: str) -> str:
    return os.path.dirname(template) or "/"


def job_log_path(job: Job, default: str) -> str:
    """Where `job`'s log goes: its `--output` path, else `default` (log_dir/ID.log)."""
    if not job.output:
        return default
    return output_path(job.output, job.id, job.array_id, job.array_index)


def output_path(template: str, job_id: int, array_id: int | None, index: int | None) -> str:
    """The path of one job's log from its template."""
    array = job_id if array_id is None else array_id
    return (
        template.replace("{id}", str(job_id))
        .replace("{array}", str(array))
        .replace("{index}", str(0 if index is None else index))
    )
