"""Item 7 of issue 27: the socket's directory is checked again just before `bind`.

A `socket:` under a directory that did not exist at the daemon's start-up check (in the
shared temp directory) could be made by a user before the daemon bound the socket in it;
the user then swapped in a socket of their own and read other users' submits (won 3 of 3).
Here the directory is mallory's by the time the daemon binds: it refuses, with one line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from gpusched.core.errors import GpuschedError
from gpusched.daemon.server import Server
from gpusched.daemon.services import Services
from tests.daemon_harness import in_process_scheduler
from tests.users import User


def test_a_socket_directory_a_user_made_since_start_up_is_refused_at_bind(
    people: tuple[User, User], tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("plays a user against root's bind")
    mallory, _victim = people
    scheduler = in_process_scheduler(tmp_path, "1x24G")
    services = Services(scheduler, scheduler.store, scheduler.context.settings, owner_uid=0)
    shared = Path(tempfile.mkdtemp(prefix="gpusched-shared-", dir="/tmp"))
    shared.chmod(0o1777)  # like /tmp: sticky, writable by all
    made_by_mallory = shared / "gpusched"
    made_by_mallory.mkdir()
    os.chown(made_by_mallory, mallory.uid, mallory.gid)
    server = Server(services, made_by_mallory / "gpusched.sock")
    try:
        with pytest.raises(GpuschedError, match="another user could replace it"):
            server.bind()
        assert not (made_by_mallory / "gpusched.sock").exists()
        # A directory of root's under the same sticky directory is fine.
        ours = Server(services, shared / "root-made" / "gpusched.sock")
        ours.bind()
        ours.close()
    finally:
        scheduler.store.close()
