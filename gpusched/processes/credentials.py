"""How a child of the daemon drops to its owner: the Popen arguments for uid, gid and
supplementary groups, and the owner's working directory entered with the owner's rights.

Daemon-wide, not the supervisor's alone: the supervisor starts each job with it, and the
daemon runs notification hooks (gpusched.daemon.hookrun) and checks a user's identity
(gpusched.daemon.identity) with the same arguments, so every child drops privileges the
same way. Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any


class DirectoryRefused(Exception):
    """The owner cannot enter the directory (absent, not a directory, or no permission:
    deliberately one error, so that nothing tells a user about a path they cannot reach)."""


def owner_credentials(uid: int, gid: int, groups: list[int]) -> dict[str, Any]:
    """Popen arguments that run a child as its owner: uid, gid and supplementary groups.

    Only root can switch; a single-user daemon runs everything as itself.
    """
    if os.geteuid() != 0 or uid == 0:
        return {}
    return {"user": uid, "group": gid, "extra_groups": groups}


@contextlib.contextmanager
def in_owners_directory(cwd: str, uid: int, gid: int, groups: list[int]) -> Iterator[None]:
    """This (single-threaded) process in `cwd`, entered as its owner, for the fork of a
    child that inherits it; then back where it was. Raises DirectoryRefused.

    As root, the path is resolved with the owner's filesystem ids and groups: every
    directory on it, and every symlink followed, is checked with the owner's rights, and
    the kernel drops root's file capabilities (DAC override, DAC read-search) while the
    filesystem uid is not 0 (capabilities(7)), exactly as a `cd` by the owner. Not Popen's
    `cwd=`, which CPython's child enters *before* it drops to the owner (a user's symlink
    would be followed as root), and not a `preexec_fn`, which runs Python in the forked
    child (its at-fork hooks and some 200 page faults: about a millisecond a job).
    """
    back = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # needs no read right
    try:
        if not owner_credentials(uid, gid, groups):
            _enter(cwd)  # as ourselves, as the child will run
        else:
            with _owners_filesystem_ids(uid, gid, groups):
                _enter(cwd)
        try:
            yield
        finally:
            os.fchdir(back)
    finally:
        os.close(back)


def _enter(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError:
        raise DirectoryRefused(cwd) from None


@contextlib.contextmanager
def _owners_filesystem_ids(uid: int, gid: int, groups: list[int]) -> Iterator[None]:
    """Root's filesystem ids and groups switched to the owner's, then back (fails closed:
    an id the kernel did not take raises before anything is entered)."""
    libc = ctypes.CDLL(None, use_errno=True)
    saved_groups = os.getgroups()
    os.setgroups(groups)
    try:
        libc.setfsgid(gid)
        libc.setfsuid(uid)
        try:
            # setfsuid/setfsgid return the previous id and report no error: asking again
            # for the same id returns the one now in force.
            if libc.setfsuid(uid) != uid or libc.setfsgid(gid) != gid:
                raise PermissionError("the owner's filesystem ids were not taken")
            yield
        finally:
            libc.setfsuid(0)  # first: root's file capabilities come back with it
            libc.setfsgid(0)
            if libc.setfsuid(0) != 0 or libc.setfsgid(0) != 0:
                os._exit(70)  # never go on half-dropped (EX_SOFTWARE)
    finally:
        os.setgroups(saved_groups)
