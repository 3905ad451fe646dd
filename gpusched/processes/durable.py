"""Files the daemon and the supervisor write so that they survive a crash or a power cut:
a JSON record replaced in one rename (a job's spec, its exit record, the drain, the boot
record), and a directory's names made durable. Stdlib only: the supervisor imports it at
every job's start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, data: dict[str, Any], durable: bool = True) -> None:
    """Replace `path` with `data` in one rename; `durable` also fsyncs it to disk."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_directory(path.parent)  # so the rename itself survives a power cut


def fsync_directory(path: Path) -> None:
    """Make the names created, renamed or removed in `path` durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
