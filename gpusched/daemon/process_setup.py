"""What the daemon process sets up for itself before it serves, and tells systemd: its
private umask and directories only root can change (trusted_dirs), its open-file limit,
what shows an earlier run here (`earlier_run`: an empty database is then refused), and
sd_notify (Type=notify: ready, reloading, stopping).
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


def os_failure(exc: OSError, path: Path | str) -> str:
    """What went wrong at `path`, in one line: the system's words, and the part of the
    path they are about when it is not `path` itself (a parent that cannot be made)."""
    why = exc.strerror or str(exc)
    if exc.filename is not None and os.fsdecode(exc.filename) != str(path):
        why += f" ({os.fsdecode(exc.filename)})"
    return why


def prepare_dirs(config: Config) -> None:
    """Make the state and log directories, or raise ConfigError naming the key: a file
    in the way, a directory that cannot be made or changed (read-only file system)."""
    # Everything the daemon creates is private unless opened up on purpose below; jobs
    # get their submitter's umask explicitly.
    os.umask(0o077)
    # Root-only state: job specs hold users' environments. Logs: the directory is
    # traversable so owners can tail their own 0600 files (listing job ids is harmless).
    dirs = (("state_dir", config.state_dir, 0o700), ("log_dir", config.log_dir, 0o755))
    for key, path, _mode in dirs:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{key} {path}: not a directory")
    check_dirs_are_ours(config)
    for key, path, mode in dirs:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
        except OSError as exc:
            raise ConfigError(f"{key} {path}: cannot create it: {os_failure(exc, path)}") from None
    check_dirs_are_ours(config)  # again: a name made meanwhile is not followed by chmod
    for key, path, mode in dirs:
        try:
            os.chmod(path, mode)
        except OSError as exc:
            raise ConfigError(
                f"{key} {path}: cannot set its mode: {os_failure(exc, path)}"
            ) from None


def earlier_run(config: Config) -> str | None:
    """What shows that a daemon ran here before and got past its database's first
    migration, in words; None: nothing (a first start, or a crash before that migration,
    which leaves an empty database file and nothing else). The boot record is written at
    every start once the database is open (gpusched.scheduling.boot); a job's directory
    and its log once it started."""
    if (config.state_dir / "boot.json").exists():
        return f"{config.state_dir / 'boot.json'} shows an earlier run"
    with contextlib.suppress(OSError):
        if any(entry.name.isdigit() for entry in os.scandir(config.state_dir / "jobs")):
            return f"{config.state_dir / 'jobs'} holds jobs of an earlier run"
    with contextlib.suppress(OSError):
        if any(entry.name.endswith(".log") for entry in os.scandir(config.log_dir)):
            return f"{config.log_dir} holds job logs of an earlier run"
    return None
