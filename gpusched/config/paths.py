"""Where gpusched's files are by default: the system service's config and socket, a
user's own daemon's state directory and socket, and the config named by the caller.

Apart from gpusched.config.settings so that a client finding its daemon's socket (every CLI
command) reads these without importing the config parser and its YAML.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_CONFIG_PATH = Path("/etc/gpusched/config.yaml")
SYSTEM_SOCKET_PATH = Path("/run/gpusched/gpusched.sock")


def user_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpusched"


def user_socket_path() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "gpusched.sock"
    return user_state_dir() / "gpusched.sock"


def config_path_from_env(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get("GPUSCHED_CONFIG")
    return Path(env) if env else None
