"""Throw-away Unix users for tests, and running a function as one of them.

Creating users needs root (CI runs as root); without it the tests that use these skip.
`as_user()` forks, drops to the user's uid, gid and groups exactly as a login would, and
runs a function there, so the daemon sees that user through SO_PEERCRED.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import subprocess
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpusched.core.errors import GpuschedError


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str

    def groups(self) -> list[int]:
        return os.getgrouplist(self.name, self.gid)


def _require_root() -> None:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create throw-away users")


@contextlib.contextmanager
def throwaway_users(
    count: int, extra_group: bool = True
) -> Iterator[tuple[list[User], str | None]]:
    """Create `count` users (and one extra group they all belong to); delete them after."""
    _require_root()
    tag = f"{os.getpid() % 100000}{os.urandom(2).hex()}"
    group = f"gsg{tag}" if extra_group else None
    names = [f"gsu{tag}{i}" for i in range(count)]
    try:
        if group:
            subprocess.run(["groupadd", group], check=True, capture_output=True)
        for name in names:
            argv = ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name]
            if group:
                argv[1:1] = ["--groups", group]
            subprocess.run(argv, check=True, capture_output=True)
        users = []
        for name in names:
            entry = pwd.getpwnam(name)
            users.append(User(name, entry.pw_uid, entry.pw_gid, entry.pw_dir))
        yield users, group
    finally:
        for name in names:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, check=False)
            subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
        if group:
            with contextlib.suppress(KeyError):
                grp.getgrnam(group)
                subprocess.run(["groupdel", group], capture_output=True, check=False)


def as_user(user: User, fn: Callable[[], Any], umask: int = 0o022) -> Any:
    """Run fn() in a forked child as `user`; return its JSON-able result or re-raise its error.

    A GpuschedError raised in the child comes back as the same class with the same message.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        try:
            os.setgroups(user.groups())
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.environ.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
            os.chdir(user.home)
            os.umask(umask)
            payload: dict[str, Any] = {"result": fn()}
        except GpuschedError as exc:
            payload = {"error": type(exc).__name__, "message": exc.message}
        except BaseException:  # report anything, the parent decides
            payload = {"error": "crash", "message": traceback.format_exc()}
        with os.fdopen(write_fd, "w") as out:
            json.dump(payload, out)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    payload = json.loads(data)
    if "error" in payload:
        if payload["error"] == "crash":
            raise AssertionError(payload["message"])
        from gpusched.core import errors

        raise getattr(errors, payload["error"])(payload["message"])
    return payload["result"]
