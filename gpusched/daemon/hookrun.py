"""Running one notification hook: as its owner from the first step, bounded in time and output.

Owns how a hook process is started and watched; gpusched.daemon.hooks decides which hooks run,
when, and for whom.

Privileges: the daemon is multi-threaded, so no Python code may run between fork and
exec (no preexec_fn). Popen drops to the owner (groups, gid, uid) in C before exec, and
what it execs is `/bin/sh` with a fixed script that enters the directory and then execs
the hook: the chdir, and the hook's lookup in PATH, happen as the owner. (Popen's own
`cwd=` would enter the directory as root, before the drop, following a user's symlink
into a place only root may go.) The directory and the hook's argv are arguments of the
script, never part of its text. The job's directory is used if the owner can enter it,
else their home, else `/`.

Output: stdout and stderr go through a pipe that the runner's thread reads into a file in
the daemon's state directory (root's, 0600, created fresh: never a shared /tmp), at most
`hook_output_max` bytes. At that limit the daemon closes its end of the pipe: the hook's
next write fails (SIGPIPE, as under `| head -c`), so a chatty hook costs neither disk nor
daemon CPU. The file lives while the hook runs (an administrator can read a stuck hook's
output there); the end of it is quoted in the daemon's log, then it is removed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pwd
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from gpusched.core.models import _StrEnum
from gpusched.processes import cgroups
from gpusched.processes.credentials import owner_credentials

_HOOK_NUMBERS = itertools.count(1)  # names each hook's cgroup within this daemon
OUTPUT_TAIL_BYTES = 2000  # the end of a hook's output quoted in the daemon's log
_CHUNK = 65536

# First it waits until the daemon has put it in the hook's own cgroup (the daemon then
# writes a newline ahead of the job's JSON on its stdin; sh's `read` takes input a byte
# at a time from a pipe, so the hook still gets the JSON whole), so nothing the hook
# starts escapes it, not even a child that calls setsid. `cd -P` is chdir(2) on the path
# as given; `exec` replaces the shell, so the hook keeps the pid the daemon watches.
RUNNER_SCRIPT = (
    'read -r _; cd -P -- "$1" 2>/dev/null || cd -P -- "$HOME" 2>/dev/null || cd /; shift; exec "$@"'
)

# The administrator's `on_finish` runs with this environment, never the owner's: a
# user's PATH (or anything else they submitted) must not choose what an admin's hook runs.
ADMIN_HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HookResultKind(_StrEnum):
    """How a hook ended (gpusched.daemon.hooks logs each kind its own way)."""

    EXIT = "exit"  # it exited by itself, or died of a signal: see exit_code
    TIMEOUT = "timeout"  # still running at hook_timeout: it and all it started were killed
    FAILED_TO_START = "failed_to_start"  # no process: its output file or its exec failed


@dataclass(frozen=True)
class HookResult:
    kind: HookResultKind
    exit_code: int | None = None
    output: str = ""  # the end of what the hook printed (stdout and stderr)
    cut: bool = False  # its output reached hook_output_max: the pipe was closed


def runner_argv(argv: Sequence[str], cwd: str) -> list[str]:
    """The command that waits for its first line of input, enters `cwd` as the owner,
    then becomes the hook."""
    return ["/bin/sh", "-c", RUNNER_SCRIPT, "gpusched-hook", cwd, *argv]


def admin_environment(uid: int, job_variables: dict[str, str]) -> dict[str, str]:
    """The fixed environment of the administrator's hook: nothing the owner submitted."""
    env = {"PATH": ADMIN_HOOK_PATH, "LANG": "C.UTF-8", "HOME": "/"}
    with contextlib.suppress(KeyError):
        entry = pwd.getpwuid(uid)
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    env.update(job_variables)
    return env


def run_hook(
    argv: Sequence[str],
    job_json: dict[str, Any],
    *,
    env: dict[str, str],
    cwd: str,
    uid: int,
    gid: int,
    umask: int,
    timeout_s: float,
    output_path: Path,
    output_max_bytes: int,
) -> HookResult:
    """Run one hook to its end or its timeout; never raises for the hook's own failures."""
    groups = []
    if os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    # The first line lets the runner go on (RUNNER_SCRIPT), once it is in its cgroup.
    stdin = ("\n" + json.dumps(job_json) + "\n").encode()
    try:
        sink = _create(output_path)
    except OSError as exc:
        return HookResult(
            HookResultKind.FAILED_TO_START, output=f"cannot create {output_path}: {exc.strerror}"
        )
    cgroup = cgroups.hook_cgroup(f"hook-{os.getpid()}-{next(_HOOK_NUMBERS)}")
    try:
        try:
            process = subprocess.Popen(
                runner_argv(argv, cwd),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                umask=umask,
                cwd="/",  # the daemon's, until the runner enters the hook's own as the owner
                # Its own session: on timeout the whole group it started is killed (and
                # with a cgroup, every process it started, whatever its session).
                start_new_session=True,
                close_fds=True,
                **owner_credentials(uid, gid, groups),
            )
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return HookResult(HookResultKind.FAILED_TO_START, output=str(exc))
        if cgroup is not None:
            try:
                cgroup.add(process.pid)
            except OSError:
                cgroup = None  # it died already, or no cgroup after all: its group only
        timed_out, cut = _exchange(process, stdin, sink, output_max_bytes, timeout_s)
        if timed_out:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.kill()
        process.wait()
        if cgroup is not None:
            # At its end or its timeout, whatever it left (in any session) is stopped, as
            # a batch job's supervisor stops what a job leaves.
            cgroups.kill_all(cgroup)
        size = os.fstat(sink).st_size
        tail = os.pread(sink, OUTPUT_TAIL_BYTES, max(0, size - OUTPUT_TAIL_BYTES))
        kind = HookResultKind.TIMEOUT if timed_out else HookResultKind.EXIT
        return HookResult(kind, process.returncode, tail.decode(errors="replace").strip(), cut)
    finally:
        if cgroup is not None:
            cgroups.kill_all(cgroup)
            cgroups.remove_job_cgroup(cgroup)
        os.close(sink)
        with contextlib.suppress(OSError):
            os.unlink(output_path)


def _create(path: Path) -> int:
    """A fresh 0600 file at `path` (in the daemon's own directory; never a planted one)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by a daemon that died while this hook ran
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


class _Output:
    """The hook's output pipe, copied to the file up to `max_bytes`, then closed."""

    def __init__(self, pipe: BinaryIO, sink: int, max_bytes: int) -> None:
        self.pipe, self.sink, self.room = pipe, sink, max_bytes
        self.done = self.cut = False  # done: end of file, or cut at the limit

    def pull(self) -> bool:
        """Copy what the pipe holds now (one read); False when there is nothing more."""
        try:
            chunk = os.read(self.pipe.fileno(), _CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self.done = True
            return False
        try:
            os.write(self.sink, chunk[: self.room])  # a regular file: written whole
        except OSError:  # e.g. the state directory's disk is full: keep what we have
            self.room = 0
        if len(chunk) > self.room:
            self.done = self.cut = True  # the caller closes the pipe
            return False
        self.room -= len(chunk)
        return True


def _exchange(
    process: subprocess.Popen[bytes], data: bytes, sink: int, max_bytes: int, timeout_s: float
) -> tuple[bool, bool]:
    """Feed the hook its stdin and copy its output to `sink` until it exits or the timeout.

    Returns (timed out, output cut). Ends when the hook's main process exits, not when
    its output does: a child it left running in the background does not hold us.
    """
    stdin_pipe, stdout_pipe = cast(BinaryIO, process.stdin), cast(BinaryIO, process.stdout)
    deadline = time.monotonic() + timeout_s
    stdin = stdin_pipe.fileno()
    os.set_blocking(stdin, False)
    os.set_blocking(stdout_pipe.fileno(), False)
    output = _Output(stdout_pipe, sink, max_bytes)
    pidfd = os.pidfd_open(process.pid)
    selector = selectors.DefaultSelector()
    selector.register(pidfd, selectors.EVENT_READ)
    selector.register(stdout_pipe, selectors.EVENT_READ)
    selector.register(stdin, selectors.EVENT_WRITE)
    sent = 0
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, output.cut
            for key, _ in selector.select(remaining):
                if key.fd == pidfd:
                    # It exited: copy what it wrote before, then stop.
                    while not output.done and output.pull():
                        pass
                    return False, output.cut
                if key.fd == stdin:
                    try:
                        sent += os.write(stdin, data[sent : sent + _CHUNK])
                    except BrokenPipeError:  # a hook that does not read its stdin: fine
                        sent = len(data)
                    if sent >= len(data):
                        selector.unregister(stdin)
                        stdin_pipe.close()
                elif not output.done:
                    output.pull()
                    if output.done:
                        # Closing our end at the limit: the hook's next write fails, as
                        # under `| head -c`.
                        selector.unregister(stdout_pipe)
                        stdout_pipe.close()
    finally:
        selector.close()
        os.close(pidfd)
        with contextlib.suppress(OSError):
            stdin_pipe.close()
        stdout_pipe.close()
