"""Issue 16, items 1, 2 and 7: nothing a user names is entered or run as root; fair hooks.

Mallory points her job's or hook's working directory (by a symlink, at submit or swapped
in between submit and start) into the victim's 0700 home or a root-only directory, and
tries to learn which paths exist; she puts a fake `sh` first on her PATH for the
administrator's `on_finish` hook; she floods the hook queue with slow hooks. Each test
checks the promise afterwards: nothing read, nothing revealed, the victim served.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import UsageError
from gpusched.processes.credentials import DirectoryRefused, in_owners_directory
from tests.daemon_harness import RunningDaemon, eventually
from tests.users import User, as_user

VICTIMS_TEXT = "victim-private-7f3a"  # in her 0700 home
ROOTS_TEXT = "root-private-91c2"  # in a directory only root may enter
REFUSED = "working directory {} does not exist or you cannot enter it"


@pytest.fixture
def victims_project(people: tuple[User, User]) -> Path:
    """~victim/project/secret.txt: readable inside, but the home around it is 0700."""
    _mallory, victim = people
    home = Path(victim.home)
    home.chmod(0o700)
    project = home / "project"
    project.mkdir(mode=0o755, exist_ok=True)
    secret = project / "secret.txt"
    secret.write_text(VICTIMS_TEXT + "\n")
    secret.chmod(0o644)
    for path in (project, secret):
        os.chown(path, victim.uid, victim.gid)
    return project


@pytest.fixture
def root_only() -> Iterator[Path]:
    """A directory only root may enter, holding a readable file and a subdirectory."""
    path = Path(tempfile.mkdtemp(prefix="gpusched-rootonly-", dir="/tmp"))
    (path / "present").mkdir(mode=0o755)
    (path / "root-secret").write_text(ROOTS_TEXT + "\n")
    (path / "root-secret").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as(user: User, fn: Callable[[], Any]) -> Any:
    return as_user(user, fn)


def _symlink(user: User, name: str, target: Path) -> str:
    """~user/name -> target, made by the user (replacing what was there)."""
    link = f"{user.home}/{name}"

    def make() -> None:
        if os.path.isdir(link) and not os.path.islink(link):
            os.rmdir(link)
        elif os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)

    _as(user, make)
    return link


def _mkdir(user: User, name: str) -> str:
    path = f"{user.home}/{name}"
    _as(user, lambda: os.makedirs(path, exist_ok=True))
    return path


def _submit(user: User, daemon: RunningDaemon, command: list[str], **options: Any) -> Any:
    socket_path = daemon.socket_path
    return _as(user, lambda: Client(socket_path).submit(command, mem="1G", **options).to_json())


def _release(user: User, daemon: RunningDaemon, job_id: int) -> None:
    socket_path = daemon.socket_path
    _as(user, lambda: Client(socket_path).release(job_id).to_json())


def _filesystem_ids() -> tuple[str, str]:
    """This process's uid and gid lines of /proc/self/status (real, effective, saved, fs)."""
    status = Path("/proc/self/status").read_text().splitlines()
    uid, gid = (line.split(":")[1].split() for line in status if line[:4] in ("Uid:", "Gid:"))
    return " ".join(uid), " ".join(gid)


def test_the_job_s_directory_is_entered_with_its_owner_s_rights(
    people: tuple[User, User], victims_project: Path, root_only: Path
) -> None:
    """What the supervisor relies on (credentials.in_owners_directory, before the fork of
    the job, which inherits the directory): as root, the directory is entered with the
    owner's filesystem ids and groups, so root's rights never reach a user's path, by a
    symlink or not; afterwards root's ids, groups, rights and directory are back."""
    mallory, victim = people
    before = (os.getcwd(), os.getgroups(), _filesystem_ids())
    link = _symlink(mallory, "link", victims_project)
    for refused in (str(victims_project), link, str(root_only / "present"), "/nonexistent"):
        with (
            pytest.raises(DirectoryRefused),
            in_owners_directory(refused, mallory.uid, mallory.gid, mallory.groups()),
        ):
            pass
        assert (os.getcwd(), os.getgroups(), _filesystem_ids()) == before
    with in_owners_directory(str(victims_project), victim.uid, victim.gid, victim.groups()):
        assert os.getcwd() == str(victims_project)
        assert _filesystem_ids() == before[2]  # the job drops to its owner, not us
    assert (os.getcwd(), os.getgroups(), _filesystem_ids()) == before
    assert ROOTS_TEXT in (root_only / "root-secret").read_text()  # root's rights are back


def test_a_symlink_into_another_users_home_is_refused_at_submit(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], victims_project: Path
) -> None:
    mallory, victim = people
    daemon = root_daemon()
    link = _symlink(mallory, "link", victims_project)
    with pytest.raises(UsageError) as refused:
        _submit(mallory, daemon, ["cat", "secret.txt"], cwd=link)
    assert refused.value.message == REFUSED.format(link)
    assert daemon.status("--all")["jobs"] == []
    # The daemon still serves, and the victim's own job there runs.
    job = _submit(victim, daemon, ["cat", "secret.txt"], cwd=str(victims_project))
    assert daemon.wait_state(job["id"], {"done", "failed"})["state"] == "done"
    assert VICTIMS_TEXT in daemon.log(job["id"])


def test_the_refusal_does_not_say_whether_a_path_exists(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], root_only: Path
) -> None:
    mallory, _victim = people
    daemon = root_daemon()
    answers = {}
    for name, target in (("exists", root_only / "present"), ("absent", root_only / "absent")):
        link = _symlink(mallory, name, target)
        for cwd in (link, str(target)):
            with pytest.raises(UsageError) as refused:
                _submit(mallory, daemon, ["true"], cwd=cwd)
            answers[(name, cwd == link)] = refused.value.message.replace(cwd, "PATH")
    assert set(answers.values()) == {REFUSED.format("PATH")}, answers


def test_a_directory_swapped_for_a_symlink_before_start_is_entered_as_the_owner(
    people: tuple[User, User],
    root_daemon: Callable[..., RunningDaemon],
    victims_project: Path,
    root_only: Path,
) -> None:
    mallory, victim = people
    daemon = root_daemon()
    jobs = {}
    for name, target in (("to-victim", victims_project), ("to-nowhere", root_only / "absent")):
        workdir = _mkdir(mallory, name)
        jobs[name] = _submit(mallory, daemon, ["cat", "secret.txt"], cwd=workdir, hold=True)
        _symlink(mallory, name, target)  # the swap, between submit and start
    for job in jobs.values():
        _release(mallory, daemon, job["id"])
    details = set()
    for job in jobs.values():
        ended = daemon.wait_state(job["id"], {"done", "failed", "lost", "cancelled"})
        assert (ended["state"], ended["reason"]) == ("failed", "failed_to_start"), ended
        details.add(ended["reason_detail"].replace(job["cwd"], "PATH"))
        assert VICTIMS_TEXT not in daemon.log(job["id"])
    assert details == {REFUSED.format("PATH")}  # the same whether the target exists or not
    # Nothing lost: the daemon goes on scheduling, the victim's job runs.
    job = _submit(victim, daemon, ["true"], cwd=str(victims_project))
    assert daemon.wait_state(job["id"], {"done", "failed"})["state"] == "done"


def test_a_hooks_directory_swapped_for_a_symlink_runs_nothing_there(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon], root_only: Path
) -> None:
    mallory, _victim = people
    daemon = root_daemon()
    hookdir = _mkdir(mallory, "hookdir")
    where, seen = Path(mallory.home) / "hook-where", Path(mallory.home) / "hook-seen"
    notify = (
        'sh -c \'pwd -P > "$HOME/hook-where.tmp"; cat root-secret > "$HOME/hook-seen";'
        ' mv "$HOME/hook-where.tmp" "$HOME/hook-where"\''
    )
    job = _submit(mallory, daemon, ["true"], cwd=hookdir, hold=True, notify=notify)
    _symlink(mallory, "hookdir", root_only)
    _release(mallory, daemon, job["id"])
    daemon.wait_state(job["id"], {"done", "failed", "lost", "cancelled"})
    eventually(where.exists, timeout=20)
    assert where.read_text().strip() == mallory.home  # the runner fell back to her home
    assert ROOTS_TEXT not in seen.read_text()


def test_the_admins_hook_never_runs_the_owners_programs(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, _victim = people
    # An administrator's hook holding a webhook token (as in the report).
    on_finish = ["sh", "-c", 'echo "token=ADMIN-WEBHOOK" > /dev/null; env > "$HOME/admin-env"']
    daemon = root_daemon(on_finish=on_finish)
    home = Path(mallory.home)
    captured = home / "captured"

    def plant_fake_sh() -> None:
        (home / "bin").mkdir(exist_ok=True)
        fake = home / "bin" / "sh"
        fake.write_text(f'#!/bin/sh\necho "$@" >> {captured}\nexec /bin/sh "$@"\n')
        fake.chmod(0o755)

    _as(mallory, plant_fake_sh)
    env = {"PATH": f"{home}/bin:/usr/bin:/bin", "HOME": str(home), "MALLORY_MARK": "1"}
    job = _submit(mallory, daemon, ["true"], cwd=str(home), env=env)
    daemon.wait_state(job["id"], {"done", "failed"})
    admin_env = home / "admin-env"
    eventually(lambda: admin_env.exists() and "GPUSCHED_JOB_STATE" in admin_env.read_text())
    assert not captured.exists(), captured.read_text()
    seen = dict(line.split("=", 1) for line in admin_env.read_text().splitlines() if "=" in line)
    assert seen["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert (seen["HOME"], seen["LANG"]) == (mallory.home, "C.UTF-8")
    assert seen["GPUSCHED_JOB_ID"] == str(job["id"])
    assert "MALLORY_MARK" not in seen


def test_one_users_slow_hooks_do_not_delay_anothers(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    timeout_s, floods = 3, 20  # mallory's hooks hold a slot for 60 s in all
    daemon = root_daemon(hook_timeout=f"{timeout_s}s")
    socket_path = daemon.socket_path

    def flood() -> list[int]:
        client = Client(socket_path)
        ids = [client.submit(["true"], mem="1G", notify="sleep 600").id for _ in range(floods)]
        return [job.id for job in client.wait(ids, timeout=60)]

    _as(mallory, flood)
    notified = Path(victim.home) / "notified"
    notify = (
        'sh -c \'date +%s.%N > "$HOME/notified.tmp"; mv "$HOME/notified.tmp" "$HOME/notified"\''
    )
    submitted = time.time()
    _submit(victim, daemon, ["true"], cwd=victim.home, notify=notify)
    eventually(notified.exists, timeout=floods * timeout_s)
    delay = float(notified.read_text()) - submitted
    killed = daemon.stderr().count(f"still running after {timeout_s}s: killed")
    assert killed < floods, "mallory's hooks should still be queued when the victim's ran"
    # Shared workers made the victim wait for most of mallory's queue (about 15 s here);
    # now only for their own job to run.
    assert delay < 2 * timeout_s, f"the victim's hook ran {delay:.1f}s after submit"
