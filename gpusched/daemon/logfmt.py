"""The daemon log's format: one record per line, whatever a user's string holds.

The daemon logs to stderr (journald under systemd, one entry per line). Messages quote
users' strings (`sanitize.quoted`); as a safety net for any message that does not, the
formatter passes every message through `sanitize.shown`, so a newline, CR or ESC in a
job's name, command or an exception's text is written escaped and can never forge a line
or colour an administrator's terminal. A traceback keeps its lines, each prefixed with
"  | " (and escaped), so none of them can pass for a record of its own.
"""

from __future__ import annotations

import logging

from gpusched.core.sanitize import shown

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTINUATION = "  | "


class OneLineFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = shown(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _continuation(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _continuation(super().formatStack(stack_info))


def _continuation(text: str) -> str:
    return "\n".join(CONTINUATION + shown(line) for line in text.splitlines())


def log_handler() -> logging.Handler:
    """The daemon's stderr handler with the one-line formatter."""
    import sys

    from gpusched.store.engine import DATABASE_OUTAGE

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(FORMAT))
    handler.addFilter(DATABASE_OUTAGE)  # an outage: one line, not a traceback a pass
    return handler
