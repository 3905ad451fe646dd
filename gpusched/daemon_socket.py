"""Which daemon a client talks to: one daemon per server.

The order: `--socket` (or `Client(socket_path=...)`), then $GPUSCHED_SOCKET, then the
socket of a config file named with `--config`/$GPUSCHED_CONFIG (or /etc/gpusched as root),
then the system service's socket whenever a system service is installed, and only then
the user's personal daemon. A personal daemon is never silently preferred while a system
one is installed: a user told "cannot reach the daemon" while the service restarts would
otherwise start a personal daemon, which runs their jobs past every limit the system one
sets.

"Installed" means any of: the system socket exists; its directory exists (the unit's
RuntimeDirectoryPreserve=yes keeps /run/gpusched across a restart, while the daemon
removes its socket on a clean stop); /etc/gpusched/config.yaml exists (the documented
install puts it there). $GPUSCHED_SYSTEM_SOCKET moves the system socket (tests point it
into a temporary directory); when it is set, /etc/gpusched is not consulted.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpusched.config.paths import (
    SYSTEM_CONFIG_PATH,
    SYSTEM_SOCKET_PATH,
    config_path_from_env,
    user_socket_path,
)
from gpusched.core.errors import UsageError

SYSTEM_SOCKET_ENV = "GPUSCHED_SYSTEM_SOCKET"


class SocketChoice:
    """The socket chosen, the candidates tried, whether it is the system service's
    (chosen because the service is installed), and what named it (`source`: "option",
    "env", "config", "system" or "personal"), for the advice when nothing answers there.
    A plain class, not a dataclass: every client command makes one, and `dataclasses`
    costs `gpusched status` its import."""

    __slots__ = ("path", "source", "system", "tried")

    def __init__(self, path: Path, tried: list[Path], system: bool, source: str) -> None:
        self.path = path
        self.tried = tried
        self.system = system
        self.source = source


def system_socket_path() -> Path:
    """Where the system service listens ($GPUSCHED_SYSTEM_SOCKET, for tests)."""
    moved = os.environ.get(SYSTEM_SOCKET_ENV)
    return Path(moved) if moved else SYSTEM_SOCKET_PATH


def system_service_installed() -> bool:
    """Whether a system daemon serves this machine (running or not: it may be restarting)."""
    sock = system_socket_path()
    if sock.exists() or sock.parent.is_dir():
        return True
    return not os.environ.get(SYSTEM_SOCKET_ENV) and SYSTEM_CONFIG_PATH.exists()


def choose_socket(
    explicit: str | os.PathLike[str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> SocketChoice:
    """The socket a client uses, the candidates tried (for the error message), and whether
    it is the system service's."""
    if explicit:
        return SocketChoice(Path(explicit), [Path(explicit)], system=False, source="option")
    env = os.environ.get("GPUSCHED_SOCKET")
    if env:
        return SocketChoice(Path(env), [Path(env)], system=False, source="env")
    named = config_path_from_env(str(config_path) if config_path else None)
    if named is not None or (os.geteuid() == 0 and SYSTEM_CONFIG_PATH.exists()):
        system = named is None
        path = configured_socket(named or SYSTEM_CONFIG_PATH)
        return SocketChoice(path, [path], system=system, source="system" if system else "config")
    if system_service_installed():
        path = system_socket_path()
        return SocketChoice(path, [path], system=True, source="system")
    # Root's own daemon (no config) listens where the system service would.
    personal = system_socket_path() if os.geteuid() == 0 else user_socket_path()
    return SocketChoice(personal, [personal], system=False, source="personal")


def configured_socket(config_path: Path) -> Path:
    """The socket a config file names (the default one where it names none): its plain
    `socket:` line read without YAML, else the file parsed and checked whole."""
    from gpusched.config.socket_key import socket_setting

    default = SYSTEM_SOCKET_PATH if os.geteuid() == 0 else user_socket_path()
    found = socket_setting(config_path, default)
    if found is not None:
        return found
    from gpusched.config.settings import load_config  # the parser and YAML: only then

    return load_config(config_path).socket_path


def resolve_socket(
    explicit: str | os.PathLike[str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> tuple[Path, list[Path]]:
    """The socket to use, and the candidates tried (for the error message)."""
    choice = choose_socket(explicit, config_path)
    return choice.path, choice.tried


def refuse_personal_daemon(
    config_path: Path | None, simulate: str | None, socket: str | None
) -> None:
    """UsageError when a user's own daemon would drive the real GPUs of a machine that a
    system service serves: its jobs would escape that service's limits and fair share,
    and the service would see them only as "other processes". Simulated GPUs, or a socket
    of its own (--socket, $GPUSCHED_SOCKET, `socket:` in its config), are allowed: such a
    daemon is someone's deliberate choice and no client finds it by default."""
    if os.geteuid() == 0 or simulate or socket or not system_service_installed():
        return
    from gpusched.config.settings import load_config

    config = load_config(config_path)
    if config.simulate or config.socket_path != user_socket_path():
        return
    raise UsageError(
        f"a system gpusched service serves this machine ({system_socket_path()}): submit"
        " there (`gpusched status`; if it is not answering, it may be restarting). A"
        " personal daemon would escape its limits; to try gpusched on your own, use"
        " `gpusched daemon --simulate 2x24G`, or give it its own --socket"
    )
