"""The supervisor zygote: forks job supervisors from an interpreter that is already warm.

Starting `python -m gpusched.processes.supervisor SPEC` costs a fresh interpreter per job (40+ ms,
most of a short job's dispatch time). The daemon instead starts this small helper once;
it imports the supervisor and then, for each job, forks a copy of itself that becomes
the job's supervisor, exactly as if it had been started fresh: its own session, default
signal handlers, stdin and stdout on /dev/null, stderr in the job's `supervisor.err`, no
other inherited descriptor.

The control channel is one end of a socketpair inherited from the daemon (fd number in
argv), never a name in the filesystem, so no user can reach it. A request is the path of
a job's spec; the reply is the new supervisor's pid (or `error: ...`). The zygote runs
single-threaded (so fork is safe) as the daemon's user; the supervisor drops to the job's
owner for the job alone, as before.

Lifetime: the zygote exits as soon as its control channel reaches end of file, which
happens whenever the daemon ends, however it ends (the kernel closes a killed process's
descriptors). PR_SET_PDEATHSIG is not used: it fires when the *thread* that started us
exits, and the daemon may restart the zygote from a short-lived worker thread. The
supervisors it forked are in their own sessions and outlive it, as jobs outlive the
daemon; it reaps the ones that end while it lives (afterwards init does).

Identity: a forked supervisor does not have the command line of one started fresh (it
shows a title naming its job, set with setproctitle), so a restarted daemon cannot find
it by command line. Before the child may do anything, the zygote records
the child's pid and kernel start time in `supervisor.json` next to the spec. The child
waits until the zygote has closed a pipe to it, then runs only if that record names it:
a supervisor runs a job if and only if its identity is on record, so a daemon that died
at any point can always tell whether the job started (see Launcher and adopt_running).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path

from setproctitle import setproctitle

from gpusched.processes.pidref import is_same_ticks, start_ticks
from gpusched.processes.supervisor import Supervisor, read_spec

IDENTITY_FILE = "supervisor.json"
MAX_REQUEST_BYTES = 4096
_MAX_FD = max(os.sysconf("SC_OPEN_MAX"), 1024)


def _read_identity(job_dir: Path) -> dict[str, object] | None:
    """The zygote's record for this job dir; None if there is none or it was cut short."""
    try:
        identity = json.loads((job_dir / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) else None


def recorded_pid(job_dir: Path) -> int | None:
    """The pid the zygote recorded for this job dir, alive or not: whether a supervisor
    was allowed to run the job (the child itself, and a launcher whose zygote failed)."""
    pid = (_read_identity(job_dir) or {}).get("pid")
    return pid if isinstance(pid, int) else None


def recorded_supervisor(job_dir: Path) -> int | None:
    """The pid of the live supervisor the zygote recorded for this job dir, if any."""
    identity = _read_identity(job_dir) or {}
    pid, ticks = identity.get("pid"), identity.get("start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return None
    return pid if is_same_ticks(pid, ticks) else None


def _become_supervisor(spec_path: Path, hold_r: int) -> int:
    """In the forked child: wait for the identity record, detach, run the supervisor."""
    os.setsid()  # first: a signal to the zygote's process group must not reach the job
    # Wait until the zygote has written our identity (it then closes its end of the pipe,
    # or dies); run only if the record names us, so a job never runs unrecorded.
    while os.read(hold_r, 1):
        pass
    os.close(hold_r)
    job_dir = spec_path.parent
    if recorded_pid(job_dir) != os.getpid():
        return 1
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    # The descriptors a fresh `python -m gpusched.processes.supervisor` would have, nothing else.
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(job_dir / "supervisor.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    # The control channel, the zygote's wake-up pipe, `null` and `err` (the channel's
    # socket object is never used or collected here: the child ends with os._exit).
    os.closerange(3, _MAX_FD)
    spec = read_spec(spec_path)
    # What `ps` shows (it would show the zygote's command line): the job, and the spec
    # path, the same that `python -m gpusched.processes.supervisor SPEC` would show.
    setproctitle(f"gpusched supervisor: job {spec['job_id']} {spec_path}")
    return Supervisor(spec, job_dir / "exit.json").run()


def fork_supervisor(spec_path: Path) -> int:
    """Fork a supervisor for the spec; return its pid once its identity is on record."""
    hold_r, hold_w = os.pipe()
    sys.stderr.flush()  # nothing buffered may be written twice
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(hold_w)
            code = _become_supervisor(spec_path, hold_r)
        except BaseException:  # the child must end here, whatever happened: never return
            with contextlib.suppress(Exception):
                traceback.print_exc()
                sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(hold_r)
    try:
        record = json.dumps({"pid": pid, "start_ticks": start_ticks(pid)}).encode()
        # Written in place, not renamed into place: a record cut short (the zygote killed
        # while writing) does not parse, and every reader (the child itself, the launcher,
        # adoption) takes that as "not recorded", so the child does not run. Not fsynced:
        # it must outlive the daemon, not a power cut (after one, every supervisor is gone
        # and the job's fate comes from its exit record).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(spec_path.with_name(IDENTITY_FILE), flags, 0o600)
        try:
            os.write(fd, record)
        finally:
            os.close(fd)
    finally:
        os.close(hold_w)  # lets the child go on (it runs only if the record names it)
    return pid


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(control: socket.socket, jobs_dir: Path) -> int:
    """Answer fork requests until the daemon closes the channel (or dies)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake select (reaping)
    # Ctrl-C on a daemon in a terminal reaches its whole process group: the daemon
    # decides when we stop, by closing the channel.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watched: list[socket.socket | int] = [control, wake_r]
    while True:
        ready, _, _ = select.select(watched, [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        _reap()
        if control not in ready:
            continue
        try:
            request = control.recv(MAX_REQUEST_BYTES)
        except ConnectionResetError:
            request = b""
        if not request:
            return 0  # the daemon is gone or done with us
        spec_path = Path(os.fsdecode(request))
        if spec_path.parent.parent != jobs_dir or spec_path.name != "spec.json":
            reply = f"error: not a job spec: {spec_path}"
        else:
            try:
                reply = str(fork_supervisor(spec_path))
            except OSError as exc:
                reply = f"error: {exc}"
        try:
            control.send(reply.encode())
        except OSError:  # the daemon went away while we forked: the supervisor stands
            return 0


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m gpusched.processes.zygote CONTROL_FD JOBS_DIR", file=sys.stderr)
        return 2
    control = socket.socket(fileno=int(argv[1]))
    return serve(control, Path(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
