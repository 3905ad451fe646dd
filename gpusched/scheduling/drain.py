"""Where the drain switch is kept: a small file in the daemon's state directory.

A drain must outlive the daemon (an administrator drains before maintenance, which
often restarts the daemon or the machine), so it is written durably, and a daemon that
starts finds it again. Only the daemon reads and writes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from gpusched.core.models import Drain
from gpusched.processes.durable import fsync_directory, write_json_atomically

log = logging.getLogger("gpusched.drain")

DRAIN_FILE = "drain.json"


def load_drain(state_dir: Path) -> Drain | None:
    """The drain in force, if any; an unreadable record counts as drained (the careful side)."""
    path = state_dir / DRAIN_FILE
    try:
        return Drain.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("cannot read %s (%s): staying drained until `gpusched undrain`", path, exc)
        return Drain("unknown", "1970-01-01T00:00:00.000+00:00", f"unreadable {path}")


def save_drain(state_dir: Path, drain: Drain | None) -> None:
    """Record the drain (None: lift it), durably: it must survive a power cut too."""
    path = state_dir / DRAIN_FILE
    if drain is not None:
        write_json_atomically(path, drain.to_json())
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fsync_directory(state_dir)


class DrainSwitch:
    """The drain in force, as loaded at start and set by an administrator since."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self.current: Drain | None = load_drain(state_dir)

    def set(self, drain: Drain | None) -> None:
        save_drain(self._state_dir, drain)
        self.current = drain
