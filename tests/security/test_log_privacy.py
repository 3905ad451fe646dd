"""Item 12 of issue 27: with `show_commands: false` the daemon log does not quote a failed
start's program path, nor an end's detail made of the job's own output; gpusched's own
words about public facts (signal, cancelled, timeout...) are still logged."""

from __future__ import annotations

from collections.abc import Callable

from gpusched.client import Client
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user


def test_a_failed_starts_program_path_stays_out_of_the_log(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    daemon = root_daemon()  # show_commands: false, the default
    sock = daemon.socket_path
    marker = "tok-3f9a1c"
    program = f"{mallory.home}/{marker}/train"
    # Held, then released: a program missing at submit is refused unless the job waits
    # (gpusched.submitter), and it is the failed start at the daemon that this test is about.
    job = as_user(mallory, lambda: Client(sock).submit([program], mem="1G", hold=True).to_json())
    as_user(mallory, lambda: Client(sock).release(job["id"]).to_json())
    ended = daemon.wait_state(job["id"], {"failed"})
    assert ended["reason"] == "failed_to_start"
    assert marker in (
        as_user(mallory, lambda: Client(sock).job(job["id"]).to_json())["reason_detail"] or ""
    )
    eventually(lambda: f"job {job['id']} failed" in daemon.stderr())
    assert marker not in daemon.stderr()
