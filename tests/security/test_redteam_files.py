"""Files and directories a root daemon writes, against a local user (issue 16's last line).

Mallory plays against the database and the directories of the config: what the daemon
finds already there must not let her read others' data or redirect what root writes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from gpusched.client import Client
from gpusched.daemon.trusted_dirs import untrusted_part
from gpusched.store.database import make_private
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user


def test_a_database_found_readable_is_made_private_before_it_takes_jobs(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """A database restored with `cp` (umask 022) is 0644; SQLite gives its WAL the same
    mode, and both hold every job's environment. Mallory reads them for a victim's token."""
    mallory, victim = people
    daemon = root_daemon()
    daemon.stop()
    files = [daemon.root / f"gpusched.db{suffix}" for suffix in ("", "-wal", "-shm")]
    for path in files:
        if path.exists():
            path.chmod(0o644)
    daemon.start()
    socket_path = daemon.socket_path
    job = as_user(
        victim,
        lambda: (
            Client(socket_path)
            .submit(["true"], mem="1G", env={"HF_TOKEN": "hf_victims_secret"})
            .to_json()
        ),
    )
    daemon.wait_state(job["id"], {"done"})

    def read_them() -> list[str]:
        found = []
        for path in files:
            try:
                if b"hf_victims_secret" in path.read_bytes():
                    found.append(path.name)
            except OSError:
                pass
        return found

    assert as_user(mallory, read_them) == []
    for path in files:
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert "was readable by others" in daemon.stderr()


def test_make_private_never_follows_a_link_at_a_wal_name(tmp_path: Path) -> None:
    """A link at a -wal or -shm name is left alone: its target keeps its mode."""
    target = tmp_path / "someone_elses"
    target.write_text("")
    target.chmod(0o644)
    database = tmp_path / "gpusched.db"
    database.write_text("")
    database.chmod(0o640)
    (tmp_path / "gpusched.db-wal").symlink_to(target)
    make_private(database)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE(database.stat().st_mode) == 0o600


def test_a_root_daemon_refuses_a_log_dir_another_user_could_redirect(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """An administrator puts log_dir under a directory of mallory's. She swaps `logs` for
    a link to a 0700 directory of root's; the root supervisor then created her job's log
    there, owned by her, with what her job printed (a file logrotate.d would run, say).
    The daemon now refuses to start, naming the directory, and writes nothing."""
    mallory, _victim = people
    hers = tmp_path / "hers"
    hers.mkdir()
    os.chown(hers, mallory.uid, mallory.gid)
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o700)
    (hers / "logs").symlink_to(roots)
    with pytest.raises(RuntimeError, match=f"log_dir .*: {hers} belongs to {mallory.name}"):
        root_daemon(log_dir=str(hers / "logs"))
    assert list(roots.iterdir()) == []


def test_directories_only_root_can_change_pass_the_others_are_named(
    people: tuple[User, User], tmp_path: Path
) -> None:
    mallory, _victim = people
    tmp_path.chmod(0o755)
    assert untrusted_part(tmp_path / "not" / "made" / "yet") is None  # /tmp is sticky
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    assert untrusted_part(open_to_all / "logs") == f"{open_to_all} is writable by every user"
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert untrusted_part(sticky / "logs") is None
    planted = sticky / "logs"
    planted.symlink_to(tmp_path)
    os.lchown(planted, mallory.uid, mallory.gid)  # hers: in a sticky dir she may replace it
    assert untrusted_part(planted) == f"{planted} belongs to {mallory.name}"
    ours = tmp_path / "link"
    ours.symlink_to(open_to_all)  # a link of root's is as safe as where it points
    assert untrusted_part(ours) == f"{open_to_all} is writable by every user"
