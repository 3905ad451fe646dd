"""`submit --output PATH` (issue 29): a job's log at a path its owner chose, without
handing the root daemon a way to write or read anyone else's file.

The supervisor opens the path as the job's owner (O_NOFOLLOW, a regular file of theirs),
and every read by the daemon checks the file is still theirs. Mallory aims the path at
/etc/shadow and at the victim's private file: through a link at the name, through a
directory swapped for a link after the submit check, and by swapping her finished log
for a link before asking `gpusched logs`. Nothing of theirs is written or read.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import Client
from gpusched.core.errors import GpuschedError, UsageError
from gpusched.usage.joblog import read_tail
from tests.daemon_harness import RunningDaemon
from tests.users import User, as_user

SHADOW = Path("/etc/shadow")


def _fingerprint(path: Path) -> tuple[str, int, int]:
    info = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), info.st_size, info.st_mtime_ns


def _submit(daemon: RunningDaemon, user: User, output: str, *options: Any, **kw: Any) -> int:
    socket_path = daemon.socket_path
    command = ["sh", "-c", "echo out-line; echo err-line >&2"]
    return int(
        as_user(
            user,
            lambda: Client(socket_path).submit(command, mem="1G", output=output, **kw).id,
        )
    )


def _logs(daemon: RunningDaemon, user: User, job_id: int) -> str:
    socket_path = daemon.socket_path

    def read() -> str:
        return Client(socket_path).logs(job_id).data.decode()

    return str(as_user(user, read))


def _victims_secret(victim: User) -> Path:
    private = Path(victim.home) / "private"
    private.mkdir(mode=0o755, exist_ok=True)  # readable dir: only the file is private
    secret = private / "out.log"
    secret.write_text("victim's secret\n")
    secret.chmod(0o600)
    os.chown(private, victim.uid, victim.gid)
    os.chown(secret, victim.uid, victim.gid)
    return secret


def test_the_output_lands_at_the_users_path_owned_by_them_and_logs_reads_it(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon()
    job = _submit(daemon, mallory, "run-{id}.log", cwd=mallory.home)  # relative: from cwd
    shown = daemon.wait_state(job, {"done", "failed"})
    assert shown["state"] == "done", shown
    path = Path(mallory.home) / f"run-{job}.log"
    assert shown["log_path"] == str(path)
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (mallory.uid, mallory.gid)
    assert info.st_mode & 0o777 == 0o644  # her umask (022), as her own `>` would
    assert path.read_text().splitlines() == ["out-line", "err-line"]
    assert _logs(daemon, mallory, job).splitlines() == ["out-line", "err-line"]
    cli = daemon.cli("logs", str(job))  # root may read it too, through the same checks
    assert cli.returncode == 0 and "out-line" in cli.stdout
    socket_path = daemon.socket_path
    seen = as_user(victim, lambda: Client(socket_path).job(job).to_json())
    assert (seen["output"], seen["log_path"]) == (None, None)  # her path, private as her cwd

    # A sweep: one file per job, by {array} and {index}.
    output = f"{mallory.home}/sweep-{{array}}-{{index}}.log"
    jobs = as_user(
        mallory,
        lambda: [
            (j.id, j.array_id)
            for j in Client(socket_path).submit_sweep(
                ["sh", "-c", "echo {x}"], [("x", ["a", "b"])], mem="1G", output=output
            )
        ],
    )
    for index, (job_id, array_id) in enumerate(jobs):
        assert daemon.wait_state(job_id, {"done", "failed"})["state"] == "done"
        swept = Path(mallory.home) / f"sweep-{array_id}-{index}.log"
        assert swept.read_text() == "ab"[index] + "\n"
        assert swept.stat().st_uid == mallory.uid


def test_a_bad_output_is_refused_at_submit_with_one_line(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon()
    Path(victim.home).chmod(0o700)
    socket_path = daemon.socket_path
    cases = [
        ("/etc/out.log", "--output: directory /etc does not exist or you cannot write in it"),
        (f"{victim.home}/out.log", "you cannot write in it"),
        ("/nonexistent/out.log", "does not exist or you cannot write in it"),
        (f"{mallory.home}/{{id}}/out.log", "go in the file name"),
        (f"{mallory.home}/", "expected a file name"),
    ]
    for output, message in cases:
        with pytest.raises(UsageError, match=re.escape(message)):
            _submit(daemon, mallory, output)
    with pytest.raises(UsageError, match="a sweep's jobs would share one file"):
        as_user(
            mallory,
            lambda: Client(socket_path).submit_sweep(
                ["echo", "{x}"], [("x", ["1", "2"])], mem="1G", output=f"{mallory.home}/o.log"
            ),
        )


def test_links_to_shadow_or_another_users_file_are_never_followed_as_root(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    mallory, victim = people
    daemon = root_daemon()
    Path(victim.home).chmod(0o755)  # only the file's own mode keeps it from her
    secret = _victims_secret(victim)
    # /etc/shadow changes under us (other tests add users): root's own 0600 file, with
    # the same name, in a directory every user may read, stands for it in the fingerprint.
    roots = Path(tempfile.mkdtemp(prefix="gpusched-roots-", dir="/tmp"))
    roots.chmod(0o755)
    decoy = roots / "shadow"
    decoy.write_text("root:secret-hash:19000::::::\n")
    decoy.chmod(0o600)
    before = {decoy: _fingerprint(decoy), secret: _fingerprint(secret)}
    home = Path(mallory.home)

    # A link at the name itself, to /etc/shadow, root's file and the victim's file.
    for target in (SHADOW, decoy, secret):
        link = home / f"to-{target.parent.name}-{target.name}.log"
        os.symlink(target, link)
        os.lchown(link, mallory.uid, mallory.gid)
        job = _submit(daemon, mallory, str(link))
        ended = daemon.wait_state(job, {"done", "failed"})
        assert ended["state"] == "failed", ended
        assert "cannot open log" in (ended.get("reason_detail") or ""), ended

    # A directory that passed the submit check, swapped for a link before the job starts:
    # the open happens as mallory, who may write neither /etc nor the victim's file.
    targets = [(SHADOW.parent, SHADOW.name), (roots, decoy.name), (secret.parent, secret.name)]
    for target_dir, name in targets:
        outdir = home / "out"
        outdir.mkdir()
        os.chown(outdir, mallory.uid, mallory.gid)
        job = _submit(daemon, mallory, f"{outdir}/{name}", hold=True)
        outdir.rmdir()
        os.symlink(target_dir, outdir)
        os.lchown(outdir, mallory.uid, mallory.gid)
        assert daemon.cli("release", str(job)).returncode == 0
        ended = daemon.wait_state(job, {"done", "failed"})
        assert ended["state"] == "failed", ended
        outdir.unlink()

    # Her finished log's directory swapped for a link to the victim's: `logs` (read by
    # root) must not hand her the victim's file of the same name.
    outdir = home / "out"
    outdir.mkdir()
    os.chown(outdir, mallory.uid, mallory.gid)
    job = _submit(daemon, mallory, f"{outdir}/{secret.name}")
    assert daemon.wait_state(job, {"done", "failed"})["state"] == "done"
    assert "out-line" in _logs(daemon, mallory, job)
    outdir.rename(home / "moved")
    os.symlink(secret.parent, outdir)
    os.lchown(outdir, mallory.uid, mallory.gid)
    with pytest.raises(GpuschedError, match="not a regular file of its owner's"):
        _logs(daemon, mallory, job)
    # ...nor, at the name itself, /etc/shadow.
    outdir.unlink()
    (home / "moved").rename(outdir)
    log = outdir / secret.name
    log.unlink()
    os.symlink(SHADOW, log)
    os.lchown(log, mallory.uid, mallory.gid)
    with pytest.raises(GpuschedError, match="cannot read the log"):
        _logs(daemon, mallory, job)

    # The OOM diagnosis reads a --output log's end as root: only a file of the owner's.
    assert read_tail(str(secret), owner=mallory.uid) == ""
    assert read_tail(str(secret), owner=victim.uid) == "victim's secret\n"

    assert {path: _fingerprint(path) for path in before} == before
    assert SHADOW.read_text().startswith("root:")  # never emptied (O_TRUNC) through a link
    shutil.rmtree(roots)


def test_an_output_in_a_sticky_shared_directory_is_refused_at_submit(
    people: tuple[User, User], root_daemon: Callable[..., RunningDaemon]
) -> None:
    """In /tmp anyone may plant a link or a file at the log names of a victim's future
    ids, and every one of those jobs would then fail to start: refused, with the reason."""
    _mallory, victim = people
    daemon = root_daemon()
    shared = Path(tempfile.mkdtemp(prefix="gpusched-sticky-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        for directory in ("/tmp", str(shared)):
            with pytest.raises(UsageError) as refused:
                _submit(daemon, victim, f"{directory}/run-{{id}}.log", cwd=victim.home)
            message = str(refused.value)
            assert "\n" not in message and "sticky" in message and directory in message
        own = _submit(daemon, victim, f"{victim.home}/run-{{id}}.log", cwd=victim.home)
        assert daemon.wait_state(own, {"done", "failed"})["state"] == "done"
    finally:
        shutil.rmtree(shared, ignore_errors=True)
