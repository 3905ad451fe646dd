"""A command on a pseudo-terminal of its own, as a person's shell would run it: the pty is
its controlling terminal and its process group the foreground one, so Ctrl-C written to
the pty is the kernel's SIGINT to that group, exactly as typed."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import subprocess
import termios
import time
from collections.abc import Sequence


def _take_the_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # after setsid (start_new_session): ours


class Terminal:
    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.leader, follower = pty.openpty()
        self.process = subprocess.Popen(
            list(argv),
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env=env,
            start_new_session=True,
            preexec_fn=_take_the_terminal,  # noqa: PLW1509 (one ioctl)
        )
        os.close(follower)
        self.output = ""

    def _read(self, timeout_s: float) -> bool:
        """Read what is there within `timeout_s`; False at the end (all writers gone)."""
        ready, _, _ = select.select([self.leader], [], [], timeout_s)
        if not ready:
            return True
        try:
            data = os.read(self.leader, 65536)
        except OSError:  # EIO: the last process holding the terminal has exited
            return False
        if not data:
            return False
        self.output += data.decode(errors="replace")
        return True

    def expect(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """Wait until the output matches `pattern` (a regular expression)."""
        deadline = time.monotonic() + timeout_s
        while (found := re.search(pattern, self.output)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.2)) and self.process.poll() is not None):
                raise AssertionError(f"{pattern!r} not seen; the terminal shows:\n{self.output}")
        return found

    def send(self, data: bytes) -> None:
        os.write(self.leader, data)

    def wait(self, timeout_s: float = 30.0) -> int:
        """The command's exit status, with all it wrote read."""
        deadline = time.monotonic() + timeout_s
        while self._read(0.2) and time.monotonic() < deadline:
            if self.process.poll() is not None and not select.select([self.leader], [], [], 0)[0]:
                break
        try:
            return self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running; the terminal shows:\n{self.output}") from None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            os.close(self.leader)


class Tmux:
    """A tmux server of the test's own (`-L name`, never the user's) with one window of
    120x30 running `argv`: what a person sees (`screen`) and types (`keys`)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.tmux = ["tmux", "-L", name]
        self.name = name
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", name, "-x", "120", "-y", "30", *argv],
            env=env,
            check=True,
        )

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", self.name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout

    def keys(self, *what: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *what], check=True)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, check=False)
