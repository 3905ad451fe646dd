"""Whether another user could redirect what the root daemon writes under a directory.

The daemon (root) creates job logs, specs, exit records, its database and its socket
under the directories of its config, and chowns or chmods some of them. If any
directory on the way there belongs to another user, or anyone may write in it, that
user can swap a part of the path for a symlink between the daemon's check and its
write: a job log then lands, owned by the job's owner, in any directory of root's
(tried: a log_dir under a directory of mallory's put her file in a 0700 directory of
root's). So a root daemon refuses to start with such a directory, as sshd's
StrictModes refuses such a home.

The rule, for every existing directory from / down to the path, both as written and
with its symlinks resolved: owned by root or the daemon's own user, and not writable by
others unless sticky (like /tmp: then only the owner of an entry may replace it, and
the next directory down must itself pass). A directory writable by its group passes:
groups are the administrator's to hand out (Ubuntu's /var/log is root:syslog 0775).
Directories that do not exist yet pass: the daemon makes them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpusched.daemon.identity import user_name


def _ancestors(path: Path) -> list[Path]:
    """/, then every directory down to and including `path`."""
    return [*reversed(path.parents), path]


def untrusted_part(path: Path) -> str | None:
    """Why another user could change what lies at `path`, or None if no one but us can."""
    trusted = {0, os.geteuid()}
    written = Path(os.path.abspath(path))
    for chain in (_ancestors(written), _ancestors(Path(os.path.realpath(written)))):
        for current in chain:
            try:
                info = os.lstat(current)
            except FileNotFoundError:
                break  # the daemon makes the rest, as its own
            except OSError as exc:
                return f"cannot check {current}: {exc.strerror}"
            if info.st_uid not in trusted:  # a link's owner may replace it in a sticky dir
                return f"{current} belongs to {user_name(info.st_uid)}"
            if stat.S_ISLNK(info.st_mode):
                continue  # its target is checked in the resolved chain
            if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
                return f"{current} is writable by every user"
    return None


def untrusted_dirs(named: dict[str, Path]) -> list[str]:
    """One line per config key whose directory another user could change."""
    problems = []
    for key, path in named.items():
        why = untrusted_part(path)
        if why is not None:
            problems.append(f"{key} {path}: {why}")
    return problems
