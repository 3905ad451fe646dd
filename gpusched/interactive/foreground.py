"""Running `gpusched run`'s command attached to the caller's terminal, as the caller.

The command is this process's child. When we are the terminal's foreground job, it runs
in a process group of its own that gets the terminal (as a shell runs a job): Ctrl-C and
Ctrl-\\ reach the command alone, Ctrl-Z stops it and then this process too, so the
caller's shell sees the job stopped, and `fg` gives the terminal back to the command.
Otherwise (started in the background, or with no terminal) it stays in our process group,
so the caller's shell controls both as one job, and we ignore what the terminal sends.
A stop asked by the daemon (SIGTERM to this process: cancel, --time, idle) or a hang-up
is passed on to the command; SIGKILL follows after `kill_grace`. The child is killed by
the kernel if this process dies (PR_SET_PDEATHSIG): the reservation ends with it, so must
the command.

This process is a child subreaper (PR_SET_CHILD_SUBREAPER), as a batch job's supervisor
is: whatever the command leaves behind, even after a double fork and setsid, is
re-parented to us, not to init. Once the command has ended (by itself, or stopped for
cancel, --time or idleness), every process left gets SIGTERM, then after `kill_grace` is
frozen and SIGKILLed until none is left (gpusched.processes.treekill, the supervisor's
code), and only then is the end reported: nothing keeps the card's CUDA_VISIBLE_DEVICES
past the reservation. What a SIGKILLed client leaves (no code of ours runs then) goes to
init: the daemon ends the reservation, not those processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from gpusched.processes import treekill

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_SLEEP_S = 1.0  # a missed wakeup costs at most this


def _noted(signum: int, frame: FrameType | None) -> None:
    """A handler that only makes the signal wake us (through the wakeup fd)."""


@contextlib.contextmanager
def _sigttou_ignored() -> Iterator[None]:
    """tcsetpgrp from a background group raises SIGTTOU: ignored while we hand over."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _foreground_tty() -> int | None:
    """A descriptor of our controlling terminal, if our group is its foreground group."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
    try:  # stdin, stdout and stderr redirected: the terminal may still be ours
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        if os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    os.close(fd)
    return None


def _child_setup(parent: int, tty: int | None) -> Callable[[], None]:
    """Run in the child before exec: its own group, in the foreground, dies with us."""

    def setup() -> None:
        if tty is not None:
            os.setpgid(0, 0)
            # In the child too, before exec: a command that reads the terminal at once
            # must already own it, or it would stop (SIGTTIN) before the parent hands over.
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(tty, os.getpgrp())
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # we died before the prctl: do not run orphaned
            os._exit(1)

    return setup


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _reap_any() -> None:
    """Collect every child that ended: orphans re-parented to us, once the command is."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


class Attached:
    """The command, running in the foreground of our terminal; `wait()` for its status."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        kill_grace_s: float,
        on_stop: Callable[[int], None],
    ) -> None:
        """`on_stop(signum)`: called once, when a stop is asked (before it is passed on)."""
        self.tty = _foreground_tty()
        self.kill_grace_s = kill_grace_s
        self.on_stop = on_stop
        self.stop_signal: int | None = None
        self._kill_at: float | None = None
        previous = {
            signum: signal.getsignal(signum)
            for signum in (
                signal.SIGINT,
                signal.SIGQUIT,
                signal.SIGTERM,
                signal.SIGHUP,
                signal.SIGCHLD,
            )
        }
        self._previous = previous
        _become_subreaper()  # before the command starts: nothing it forks may escape
        self.child = subprocess.Popen(
            list(argv),
            env=env,
            preexec_fn=_child_setup(os.getpid(), self.tty),  # noqa: PLW1509 (single-threaded)
        )
        self.pgid = self.child.pid if self.tty is not None else None
        if self.pgid is not None:
            with contextlib.suppress(OSError):
                os.setpgid(self.pgid, self.pgid)  # also here: whichever runs first wins
            self._give_terminal()
        # Ctrl-C and Ctrl-\ are the command's: should they reach us (no terminal of our
        # own, or the same group), we stay to report its end.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._asked_to_stop)
        signal.signal(signal.SIGHUP, self._asked_to_stop)
        # Woken by signals, not by polling: a handled signal (the child's SIGCHLD when it
        # ends or stops, a stop asked) writes a byte here (the interpreter's wakeup fd).
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wakeup_write = wakeup_write
        self._previous_wakeup = signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, _noted)

    def _asked_to_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _give_terminal(self) -> None:
        if self.tty is not None and self.pgid is not None:
            with _sigttou_ignored(), contextlib.suppress(OSError):
                os.tcsetpgrp(self.tty, self.pgid)

    def _take_terminal(self) -> None:
        if self.tty is not None:
            with _sigttou_ignored(), contextlib.suppress(OSError):
                os.tcsetpgrp(self.tty, os.getpgrp())

    def _signal_group(self, signum: int) -> None:
        """The command's process group, or the command alone when it shares ours."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.pgid is None:
                os.kill(self.child.pid, signum)
            else:
                os.killpg(self.pgid, signum)

    def _suspend(self) -> None:
        """The command stopped (Ctrl-Z): stop as well, so the caller's shell sees the job
        stopped; once continued, continue the command (in the foreground if we are)."""
        self._take_terminal()
        os.kill(os.getpid(), signal.SIGSTOP)
        if self.tty is not None:
            with contextlib.suppress(OSError):
                if os.tcgetpgrp(self.tty) == os.getpgrp():  # `fg`, not `bg`
                    self._give_terminal()
        self._signal_group(signal.SIGCONT)

    def _check_stop(self) -> None:
        if self.stop_signal is not None and self._kill_at is None:
            self.on_stop(self.stop_signal)
            forwarded = signal.SIGHUP if self.stop_signal == signal.SIGHUP else signal.SIGTERM
            self._signal_group(forwarded)
            self._signal_group(signal.SIGCONT)  # a stopped command must see it
            treekill.terminate_tree()  # what left the group (setsid) is asked too
            self._kill_at = time.monotonic() + self.kill_grace_s
        if self._kill_at is not None and time.monotonic() >= self._kill_at:
            self._signal_group(signal.SIGKILL)
            self._kill_at = float("inf")

    def _end_left_behind(self) -> None:
        """The command ended: SIGTERM what it left, SIGKILL it after the grace period
        (counted from the stop, when one was asked), until we have no child."""
        if not treekill.children_of(os.getpid()):
            return
        if self._kill_at is None:
            treekill.terminate_tree()
            self._kill_at = time.monotonic() + self.kill_grace_s
        while time.monotonic() < self._kill_at:
            _reap_any()
            if not treekill.children_of(os.getpid()):
                return
            self._sleep()
        treekill.kill_tree(_reap_any, self._pause)
        _reap_any()

    def _pause(self, seconds: float) -> None:
        select.select([self._wakeup_read], [], [], seconds)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup_read, 512):
                pass

    def _sleep(self) -> None:
        """Until a signal arrives (the child's SIGCHLD, a stop), or the SIGKILL is due."""
        timeout = MAX_SLEEP_S
        if self._kill_at is not None and self._kill_at != float("inf"):
            timeout = max(0.0, min(timeout, self._kill_at - time.monotonic()))
        self._pause(timeout)

    def wait(self) -> int:
        """Block until the command ends: its exit code, or -N if signal N killed it."""
        flags = os.WNOHANG | (os.WUNTRACED if self.tty is not None else 0)
        try:
            while True:
                try:
                    pid, status = os.waitpid(self.child.pid, flags)
                except ChildProcessError:  # reaped elsewhere: never by us
                    return -signal.SIGKILL
                if pid == 0:
                    self._check_stop()
                    self._sleep()
                elif os.WIFSTOPPED(status):
                    self._suspend()
                else:
                    code = os.waitstatus_to_exitcode(status)
                    self.child.returncode = code
                    self._take_terminal()
                    self._end_left_behind()
                    return code
        finally:
            self._take_terminal()
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._wakeup_read)
            os.close(self._wakeup_write)
            if self.tty is not None and self.tty > 2:  # the /dev/tty we opened
                os.close(self.tty)
