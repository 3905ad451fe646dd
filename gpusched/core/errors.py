"""The gpusched exception family: one root, a few kinds, each mapped to an exit code.

Every error a person can see is one of these, with a one-line message that says
what went wrong and, where there is one, what to do next. The server turns them
into JSON error replies; the CLI turns them into a line on stderr and an exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TIMEOUT = 124
# Ctrl-C ends a command as a shell's child ends on SIGINT: 128 + 2, and nothing said
# (exit 1 is the code of a job that was cancelled).
EXIT_INTERRUPTED = 130

# How a refusal for want of the database ends: whether the request may have been applied
# (its COMMIT sent and not confirmed). The client reads them to tell a lost answer from a
# refusal (gpusched.submitter), whatever the driver's words quoted before them say.
NOTHING_CHANGED = "nothing was changed"
MAY_HAVE_BEEN_DONE = (
    "what was asked may have been done, in whole or in part: look before asking again"
)


class GpuschedError(Exception):
    """Root of every error gpusched reports to a person."""

    kind = "failed"
    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(GpuschedError):
    """The request or its input is malformed (bad size, unknown option value...)."""

    kind = "usage"
    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """The configuration file is missing or invalid."""

    kind = "config"


class NotFoundError(GpuschedError):
    """A job id that does not exist (or is not visible to the caller)."""

    kind = "not_found"


class PermissionDenied(GpuschedError):
    """The caller may not act on this job or use this daemon."""

    kind = "permission"


class ConflictError(GpuschedError):
    """The job is not in a state that allows the operation (cancel a finished job...)."""

    kind = "conflict"


class DaemonUnreachable(GpuschedError):
    """No daemon answers on the socket."""

    kind = "unreachable"
    exit_code = EXIT_UNREACHABLE


class ProtocolError(GpuschedError):
    """A frame that is not a valid request or reply."""

    kind = "protocol"
    exit_code = EXIT_USAGE


class GpuError(GpuschedError):
    """The GPUs cannot be read at all (no driver, NVML failed to initialise)."""

    kind = "gpu"


ERROR_KINDS: dict[str, type[GpuschedError]] = {
    cls.kind: cls
    for cls in (
        GpuschedError,
        UsageError,
        ConfigError,
        NotFoundError,
        PermissionDenied,
        ConflictError,
        DaemonUnreachable,
        ProtocolError,
        GpuError,
    )
}
