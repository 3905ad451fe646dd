"""Issue 16, item 5: no client, connection flood or exhausted limit ends or starves a listener.

Each test plays mallory against a root daemon under the unit's limits, then checks that the
victim can still `status` and `submit`, and that a job still starts. Where a limit of the
machine would take minutes to reach (1,000 jobs, 16,384 tasks), the test lowers the
daemon's own limit from outside first (prlimit, the cgroup's pids.max), as an
administrator could: the daemon meets the same errors, in seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched.client import Client
from gpusched.daemon.server import MAX_CONNECTIONS_PER_USER
from tests.daemon_harness import RunningDaemon, eventually
from tests.security.attackers import (
    FD_RESERVE,
    attacking,
    free_port,
    open_many,
    restore_daemon_open_files,
    set_daemon_open_files,
    tcp_connect,
    unix_connect,
    victim_is_served,
)
from tests.users import User, as_user


def test_idle_connections_to_the_metrics_port_cannot_exhaust_the_daemon(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """1,100 idle connections to /metrics (the old server gave each a thread, no timeout:
    the daemon ran out of files and its socket listener died). Fails on the old code."""
    mallory, victim = people
    port = free_port()
    daemon = root_daemon(metrics=f"127.0.0.1:{port}")
    with attacking(mallory, open_many(tcp_connect(port), 1100)) as report:
        seen = report()
        assert seen["opened"] >= 1000, seen
        assert seen["held"] <= 4, seen  # MAX_HTTP_CONNECTIONS_PER_ADDRESS
        seconds = victim_is_served(daemon, victim)
        # A scraper on another address is still served while the flood is held.
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) as c:
            c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            c.settimeout(10)
            assert c.recv(64).startswith(b"HTTP/1.0 200")
        assert daemon.process is not None
        fds = psutil.Process(daemon.process.pid).num_fds()
    print(f"metrics flood: {seen}, daemon fds {fds}, victim served in {seconds:.2f}s")


def test_a_client_trickling_its_request_loses_its_slot(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Slowloris: a byte every half second on every connection mallory may hold keeps no
    slot past the request deadline (the old daemon had only a 60 s idle timeout per read,
    so each byte renewed it). Fails on the old code."""
    mallory, victim = people
    daemon = root_daemon(client_request_timeout="2s", client_idle_timeout="30s")
    path = daemon.socket_path

    def trickle() -> dict[str, Any]:
        conns = [unix_connect(path)() for _ in range(MAX_CONNECTIONS_PER_USER)]
        began = time.monotonic()
        open_ = set(range(len(conns)))
        while open_ and time.monotonic() - began < 15:
            for i in list(open_):
                try:
                    conns[i].sendall(b" ")  # whitespace: a request that never ends
                except OSError:
                    open_.discard(i)
                    continue
                conns[i].setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    if conns[i].recv(1) == b"":
                        open_.discard(i)
            time.sleep(0.5)
        return {"still_open": len(open_), "after_s": round(time.monotonic() - began, 1)}

    with attacking(mallory, trickle) as report:
        seconds = victim_is_served(daemon, victim)
        seen = report()
    assert seen["still_open"] == 0, seen
    print(f"slowloris: {MAX_CONNECTIONS_PER_USER} connections dropped after {seen['after_s']}s")
    print(f"victim served in {seconds:.2f}s during it")


def test_out_of_open_files_the_listener_and_the_scheduler_go_on(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """EMFILE at accept (the daemon's file limit lowered to what it uses) once ended the
    socket listener for good, and every scheduling pass logged a traceback; then, near the
    limit, mallory's connections must not take the last files. Fails on the old code."""
    mallory, victim = people
    daemon = root_daemon(poll_interval="0.2s")
    set_daemon_open_files(daemon, headroom=-8)  # below what it holds: no new file at all
    with contextlib.suppress(Exception):
        as_user(victim, lambda: Client(daemon.socket_path, timeout_s=1).ping())
    try:
        eventually(lambda: "cannot accept a connection" in daemon.stderr())
    except AssertionError:
        raise AssertionError(daemon.stderr()) from None
    time.sleep(2)  # ten scheduling passes meet EMFILE meanwhile
    log = daemon.stderr()
    assert daemon.process is not None and daemon.process.poll() is None
    assert log.count("scheduling pass failed") <= 1, log  # once, not once a pass
    assert log.count("cannot accept a connection") <= 1, log
    # Some files free again, but mallory grabs all she can: she is refused past the reserve,
    # the victim's first connection is let in, and a job still starts.
    limit = set_daemon_open_files(daemon, headroom=40)
    with attacking(mallory, open_many(unix_connect(daemon.socket_path), 200)) as report:
        seen = report()
        assert seen["held"] <= 4, seen  # listening.SHORT_PER_CLIENT
        seconds = victim_is_served(daemon, victim)
    restore_daemon_open_files(daemon)
    victim_is_served(daemon, victim)
    print(f"near the file limit ({limit}): mallory {seen}; victim served in {seconds:.2f}s")


def test_jobs_beyond_the_file_limit_are_watched_and_readopted(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """Each running job costs the daemon a pidfd: more running jobs than files once made the
    starts fail and the restart die while re-adopting them. Fails on the old code."""
    mallory, victim = people
    # More jobs than the files left above the reserve (the old daemon, with no reserve,
    # ran out of files for their pidfds): a dozen are watched, the rest polled.
    jobs = FD_RESERVE + 24
    daemon = root_daemon(poll_interval="0.5s")
    # Files for a dozen pidfds above the reserve: the other jobs must be polled.
    limit = set_daemon_open_files(daemon, headroom=FD_RESERVE + 12)

    def submit_many() -> list[int]:
        client = Client(daemon.socket_path, timeout_s=30)
        return [client.submit(["sleep", "600"], mem="256M").id for _ in range(jobs)]

    ids = as_user(mallory, submit_many)

    def all_running() -> bool:
        states = {j.id: j.state for j in daemon.client().status(all=True).jobs}
        return all(states.get(i) == "running" for i in ids)

    eventually(all_running, timeout=60)  # none failed to start for want of a file
    victim_is_served(daemon, victim)
    # A restart with as few files: re-adoption polls what it cannot watch.
    daemon.stop()
    preexec = daemon.preexec

    def low_limit() -> None:
        if preexec is not None:
            preexec()
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    daemon.preexec = low_limit
    daemon.start()
    assert all_running()
    victim_is_served(daemon, victim)
    as_user(mallory, lambda: [Client(daemon.socket_path).cancel(i).id for i in ids])
    for job_id in ids:
        assert daemon.wait_state(job_id, {"cancelled"}, timeout=30)["state"] == "cancelled"
    print(f"{jobs} running jobs under an open-file limit of {limit}: watched and re-adopted")


def test_a_job_that_fills_the_task_limit_does_not_end_the_listener(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """When no thread can start (mallory's job forked up to the service's task limit), the
    old listener died of "can't start new thread". Now a spare thread serves: the victim's
    status works, a job waits instead of failing, and all is well once mallory's job is
    cancelled. Fails on the old code."""
    mallory, victim = people
    daemon = root_daemon()
    limits = daemon.limits  # type: ignore[attr-defined]
    pids = [c for c in limits.cgroups if (c / "pids.max").exists()]
    if not pids:
        pytest.skip("this machine lets no test make a pids cgroup")
    cgroup = pids[0]
    current = int((cgroup / "pids.current").read_text())
    (cgroup / "pids.max").write_text(str(current + 30))  # TasksMax, scaled to seconds
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(600)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.2)\n"
    )
    job = as_user(
        mallory,
        lambda: Client(daemon.socket_path).submit(["python3", "-c", bomb], mem="256M").to_json(),
    )
    eventually(lambda: int((cgroup / "pids.current").read_text()) >= current + 30, timeout=30)

    def victim_acts() -> dict[str, Any]:
        client = Client(daemon.socket_path, timeout_s=10)
        client.status()
        return client.submit(["true"], mem="1G").to_json()

    waiting = as_user(victim, victim_acts)
    time.sleep(1)  # a few scheduling passes fail to fork its supervisor
    # It waits, and does not fail. (It may also have started: a task slot is free for a
    # moment whenever a short-lived process of the daemon's ends, e.g. the submit's
    # directory check, and the bomb retries only every 0.2 s.)
    assert daemon.client().job(waiting["id"]).state in ("queued", "running", "done")
    as_user(mallory, lambda: Client(daemon.socket_path).cancel(job["id"]).id)
    daemon.wait_state(job["id"], {"cancelled"}, timeout=30)
    assert daemon.wait_state(waiting["id"], {"done"}, timeout=30)["state"] == "done"
    victim_is_served(daemon, victim)
    assert "cannot start a thread" in daemon.stderr()


PIDFD_GETFD = 438  # the syscall's number on every architecture since Linux 5.6


def test_a_listener_whose_socket_breaks_makes_the_daemon_exit_for_a_restart(
    root_daemon: Callable[..., RunningDaemon],
) -> None:
    """The listening socket shut down beneath the daemon (root takes a copy of the daemon's
    descriptor with pidfd_getfd and shuts it down): the old daemon kept running, deaf and
    "active"; now it exits non-zero so that systemd restarts it. Fails on the old code."""
    daemon = root_daemon()
    assert daemon.process is not None
    pid = daemon.process.pid
    inode = _listening_inode(daemon.socket_path)
    fd = next(
        int(entry.name)
        for entry in Path(f"/proc/{pid}/fd").iterdir()
        if os.readlink(entry) == f"socket:[{inode}]"
    )
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    copy = libc.syscall(PIDFD_GETFD, pidfd, fd, 0)
    os.close(pidfd)
    if copy < 0:
        pytest.skip(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
    with socket.socket(fileno=copy) as listener:
        listener.shutdown(socket.SHUT_RDWR)
    process = daemon.process
    eventually(lambda: process.poll() is not None, timeout=20)
    assert process.returncode == 1
    assert "listener ended: exiting for a restart" in daemon.stderr()


def _listening_inode(path: Path) -> int:
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == str(path) and fields[5] == "01":
            return int(fields[6])
    raise AssertionError(f"no listening socket at {path}")
