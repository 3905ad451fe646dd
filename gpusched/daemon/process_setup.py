"""What the daemon process sets up for itself before it serves, and tells systemd: its
private umask and directories only root can change (trusted_dirs), its open-file limit,
and sd_notify (Type=notify: ready, reloading, stopping).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
from pathlib import Path

from gpusched.config.settings import Config
from gpusched.core.errors import ConfigError
from gpusched.daemon.trusted_dirs import untrusted_dirs

log = logging.getLogger("gpusched.daemon")


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


def check_dirs_are_ours(config: Config) -> None:
    """As root, refuse directories another user could change under us (trusted_dirs)."""
    if os.geteuid() != 0:
        return
    named = {
        "state_dir": config.state_dir,
        "log_dir": config.log_dir,
        "socket": config.socket_path.parent,
    }
    if config.database_url.startswith("sqlite:///"):
        named["database"] = Path(config.database_url.removeprefix("sqlite:///")).parent
    problems = untrusted_dirs(named)
    if problems:
        raise ConfigError(
            "another user could redirect what the daemon writes as root: "
            + "; ".join(problems)
            + " (use directories only root can change)"
        )


def raise_open_file_limit() -> None:
    """Soft limit up to the hard one: systemd's soft default (1024) is the whole budget
    of a daemon holding a pidfd per running job and a socket per client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft in (hard, resource.RLIM_INFINITY):
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit from %s to %s: %s", soft, hard, exc)
    else:
        log.info("open files: soft limit raised from %s to %s", soft, hard)


def prepare_dirs(config: Config) -> None:
    # Everything the daemon creates is private unless opened up on purpose below; jobs
    # get their submitter's umask explicitly.
    os.umask(0o077)
    check_dirs_are_ours(config)
    # Root-only state: job specs hold users' environments.
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    config.log_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    check_dirs_are_ours(config)  # again: a name made meanwhile is not followed by chmod
    os.chmod(config.state_dir, 0o700)
    # Logs: the directory is traversable so owners can tail their own 0600 files.
    os.chmod(config.log_dir, 0o755)  # noqa: S103 - listing job ids is harmless; files are 0600
