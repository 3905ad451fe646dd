"""Authorisation: what a caller may do and see, decided from who the kernel says they are.

The rules the request handlers and the server apply to an identified `Caller`
(identity.py): who is an administrator, whom a single-user daemon serves, whose job a
caller may act on (`owned_job`), and what of another user's job a caller may see
(`visible`). Pure decisions over the store and the config: no socket, no request parsing.
"""

from __future__ import annotations

import grp
import os
import pwd
from typing import Any

from gpusched.config.settings import Config
from gpusched.core.errors import PermissionDenied
from gpusched.core.models import Job
from gpusched.daemon.identity import Caller, user_name
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import Jobs

HIDDEN_COMMAND = ["(hidden)"]
# Ends whose detail is gpusched's own words about public facts (a signal's name, who
# cancelled, which dependency failed, the memory over the declared): shown to everyone.
PUBLIC_DETAILS = frozenset({"signal", "cancelled", "dependency_failed", "overrun", "timeout"})


def is_admin(uid: int, user: str, owner_uid: int, config: Config) -> bool:
    """May act on every job: root, the daemon's own user, or one listed in `admins` by
    name or through a Unix group written "@group" (its members as the account database
    says, never as the client process claims)."""
    if uid in (0, owner_uid) or user in config.admins:
        return True
    groups = [entry[1:] for entry in config.admins if entry.startswith("@")]
    return bool(groups) and in_any_group(uid, groups)


def in_any_group(uid: int, group_names: list[str]) -> bool:
    """Whether the account `uid` belongs to one of these groups (primary or supplementary)."""
    try:
        account = pwd.getpwuid(uid)
        member_of = set(os.getgrouplist(account.pw_name, account.pw_gid))
    except (KeyError, OSError):
        return False
    for name in group_names:
        try:
            if grp.getgrnam(name).gr_gid in member_of:
                return True
        except KeyError:  # a group that does not exist (any more) admits no one
            continue
    return False


def check_served(caller: Caller, owner_uid: int) -> None:
    """A daemon run by a user (not root) serves only that user."""
    if owner_uid not in (0, caller.uid):
        raise PermissionDenied(
            f"this gpusched daemon runs as {user_name(owner_uid)} and serves only"
            " that user; start your own with `gpusched daemon`, or use the system service"
        )


def is_theirs(job: Job, caller: Caller, by_name: bool = False) -> bool:
    """Whether the job is the caller's. On one server, by uid. In a cluster (`by_name`) a
    user is a user name, as a job runs as its user name on whichever server: a uid means
    nothing on another server (the same number may be another person there)."""
    return job.user == caller.user if by_name else job.uid == caller.uid


def owned_job(jobs: Jobs, caller: Caller, job_id: int, by_name: bool = False) -> Job:
    """The job, if the caller may act on it (theirs, or the caller is an administrator)."""
    job = jobs.get(job_id)
    if not is_theirs(job, caller, by_name) and not caller.admin:
        raise PermissionDenied(
            f"job {job_id} belongs to {job.user}: you can act only on your own jobs"
        )
    return job


def visible(scheduler: Scheduler, config: Config, caller: Caller, job: Job) -> dict[str, Any]:
    """The job as the caller may see it: another user's command, directory, hook, swept
    name and private end details are hidden unless `show_commands` is on."""
    job = scheduler.decorate(job)
    data = job.to_json()
    theirs = is_theirs(job, caller, by_name=scheduler.in_cluster)
    if not theirs and not caller.admin and not config.show_commands:
        data["command"] = HIDDEN_COMMAND
        data["cwd"] = None
        data["notify"] = None if job.notify is None else HIDDEN_COMMAND
        data["notify_result"] = None  # its output is the owner's
        if job.output is not None:  # `--output`: a path of the owner's, as private as cwd
            data["output"] = None
            data["log_path"] = None
        if job.array_id is not None:
            # A swept job's name ends with its sweep values ("lr=0.1 token=..."): as
            # private as the command they were put into. Only the name as a whole is
            # stored, so the whole name is hidden (the user, array and index still show).
            data["name"] = None
        if job.reason not in PUBLIC_DETAILS:
            # A failed start names the program and the working directory; an OOM quotes
            # a line of the job's output.
            data["reason_detail"] = None
    return data
