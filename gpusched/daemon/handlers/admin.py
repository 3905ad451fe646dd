"""Requests about the daemon itself rather than a job: `ping` (who is asking, whose
daemon this is), `drain` (an administrator stops new jobs from starting), `top` (an
administrator puts one waiting job ahead of every user's) and `prune` (an administrator
forgets old ended jobs)."""

from __future__ import annotations

import os
import time
from typing import Any

from gpusched.core.clock import iso, utc_now
from gpusched.core.errors import GpuschedError, NotFoundError, PermissionDenied
from gpusched.core.models import Drain
from gpusched.core.requests.catalog import (
    DrainRequest,
    PingRequest,
    PruneRequest,
    ReloadRequest,
    TopRequest,
)
from gpusched.core.requests.protocol import VERSION
from gpusched.core.requests.replies import DrainReply, JobJson, PingReply, PruneReply, ReloadReply
from gpusched.daemon.handlers.args import text
from gpusched.daemon.identity import Caller, user_name
from gpusched.daemon.services import Services

# When this daemon's code was loaded: `doctor` compares it with the installed files (an
# upgrade or edit that kept the version number still needs a restart).
STARTED_AT = time.time()


def ping(services: Services, caller: Caller, _request: PingRequest) -> PingReply:
    return {
        "version": VERSION,
        "pid": os.getpid(),
        "started": STARTED_AT,  # epoch seconds
        "user": caller.user,  # who is asking, as the daemon sees them (SO_PEERCRED)
        "uid": caller.uid,
        "daemon_user": user_name(os.geteuid()),  # whose daemon this is
        "daemon_uid": os.geteuid(),
        "single_user": services.single_user,
    }


def drain(services: Services, caller: Caller, request: DrainRequest) -> DrainReply:
    """An administrator stops new jobs from starting (on=true) or lets them start again."""
    if not caller.admin:
        raise PermissionDenied(
            f"only an administrator (root or one listed in `admins`) may drain; {caller.user}"
            " is not one"
        )
    state = None
    if request.on:
        reason = request.reason
        state = Drain(caller.user, iso(utc_now()), None if reason is None else text(reason))
    scheduler = services.scheduler
    if request.node is not None and request.node != scheduler.node_name:
        if not scheduler.in_cluster:
            raise NotFoundError(
                f"no node {request.node}: this server is not in a cluster (its name is"
                f" {scheduler.node_name})"
            )
        if not scheduler.drain_node(request.node, state):
            raise NotFoundError(f"no node {request.node} in this cluster that is not down")
        return None if state is None else state.to_json()
    scheduler.set_drain(state)
    return drain_json(services)


def drain_json(services: Services) -> dict[str, Any] | None:
    state = services.scheduler.drain
    return None if state is None else state.to_json()


def top(services: Services, caller: Caller, request: TopRequest) -> JobJson:
    """An administrator puts a waiting job ahead of every user's jobs (fair share and
    priorities order the rest); jobs put first keep the order they were put there in."""
    if not caller.admin:
        raise PermissionDenied(
            f"only an administrator (root or one listed in `admins`) may put a job first;"
            f" {caller.user} is not one (`gpusched priority` orders your own jobs)"
        )
    job = services.store.jobs.get(request.id)
    return services.visible(caller, services.scheduler.waiting.put_first(job))


def prune(services: Services, caller: Caller, request: PruneRequest) -> PruneReply:
    """Forget jobs that ended long ago: the daemon's retention pass, with `history` set to
    the request's age (gpusched.daemon.retention)."""
    if not caller.admin:
        raise PermissionDenied(
            f"only an administrator (root or one listed in `admins`) may prune; {caller.user}"
            " is not one"
        )
    if services.retention is None:
        raise GpuschedError("this daemon has no retention pass to prune with")
    done = services.retention.prune_history(request.ended_before_s, dry_run=request.dry_run)
    return done.to_json()


def reload(services: Services, caller: Caller, _request: ReloadRequest) -> ReloadReply:
    """Apply the config file now and say how it went (systemd's ExecReload waits for it)."""
    if not caller.admin:
        raise PermissionDenied(
            f"only an administrator (root or one listed in `admins`) may reload; {caller.user}"
            " is not one"
        )
    if services.reload_config is None:
        raise GpuschedError("this daemon cannot reload its config on request: send it SIGHUP")
    return {"kept": services.reload_config()}
