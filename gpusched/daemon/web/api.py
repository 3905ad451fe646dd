"""The dashboard's JSON: what the pages poll, each reply bounded whatever the history.

Produced by the same view handlers as the socket's `status`, `history` and `show`
(handlers/views.py), called as ANONYMOUS, a viewer who owns no job and administers
nothing: a visitor sees exactly what any user's `status` shows of other users' jobs
(commands, directories and private end details hidden unless `show_commands`).
The usage figures are fair share's own (scheduling/fair_share.py).
"""

from __future__ import annotations

import socket
from typing import Any

from gpusched.core.clock import iso
from gpusched.core.requests.catalog import HistoryRequest, ShowRequest, StatusRequest
from gpusched.core.status_pages import merge_status_pages
from gpusched.daemon.handlers import views
from gpusched.daemon.identity import Caller
from gpusched.daemon.services import Services
from gpusched.scheduling.fair_share import WINDOW_HALF_LIVES, usage_by_user

# No uid is negative, so no job is ANONYMOUS's and it sees every job as a stranger does.
ANONYMOUS = Caller(pid=0, uid=-1, gid=-1, user="(dashboard)", admin=False)

# Bounds of one status reply: the rest of a long queue is counted, not listed.
RUNNING_SHOWN = 200
WAITING_SHOWN = 200
RECENT_ENDS = 20


def status(services: Services) -> dict[str, Any]:
    """GPUs, running and waiting jobs (a page each) and the latest ends."""
    running = views.status(
        services, ANONYMOUS, StatusRequest(states=("running",), limit=RUNNING_SHOWN)
    )
    waiting = views.status(
        services, ANONYMOUS, StatusRequest(states=("queued", "held"), limit=WAITING_SHOWN)
    )
    ended = views.history(services, ANONYMOUS, HistoryRequest(limit=RECENT_ENDS))
    view = merge_status_pages(running, waiting)
    return {
        "host": socket.gethostname(),
        "now": iso(services.scheduler.clock()),
        "gpus": view["gpus"],  # in a cluster, every node's that is not down
        "nodes": view["nodes"],
        "drain": view["drain"],
        "counts": view["counts"],
        "running": view["running"],
        "waiting": view["waiting"],
        "ended": ended,
    }


def job(services: Services, job_id: int) -> dict[str, Any]:
    """One job as `show` gives it to a stranger (NotFoundError if there is none)."""
    return {
        "host": socket.gethostname(),
        "now": iso(services.scheduler.clock()),
        "job": views.show(services, ANONYMOUS, ShowRequest(id=job_id, timeline=True)),
    }


def usage(services: Services) -> dict[str, Any]:
    """Each user's decayed GPU memory-time over the fair-share window, least first (the
    order fair share gives their waiting jobs), with their active jobs counted."""
    half_life_s = services.config.fair_share_half_life_s
    now = services.scheduler.clock()
    totals = {g.uuid: g.total for g in services.scheduler.gpu_reports([])}
    used = usage_by_user(services.store.jobs, totals, now, half_life_s)
    counts = services.store.jobs.count_active_by_user()
    everyone = sum(used.values())
    users = sorted(set(used) | set(counts), key=lambda user: (used.get(user, 0.0), user))
    return {
        "host": socket.gethostname(),
        "now": iso(now),
        "half_life_s": half_life_s,
        "window_s": WINDOW_HALF_LIVES * half_life_s,
        "users": [
            {
                "user": user,
                "usage": used.get(user, 0.0),  # byte-seconds, decayed
                "share": used.get(user, 0.0) / everyone if everyone else 0.0,
                "running": counts.get(user, {}).get("running", 0),
                "queued": counts.get(user, {}).get("queued", 0),
                "held": counts.get(user, {}).get("held", 0),
            }
            for user in users
        ],
    }
