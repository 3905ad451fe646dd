"""How a child of the daemon drops to its owner: the Popen arguments for uid, gid and
supplementary groups.

Daemon-wide, not the supervisor's alone: the supervisor starts each job with it, and the
daemon runs notification hooks (gpusched.daemon.hookrun) and checks a user's identity
(gpusched.daemon.identity) with the same arguments, so every child drops privileges the
same way. Stdlib only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import os
from typing import Any


def owner_credentials(uid: int, gid: int, groups: list[int]) -> dict[str, Any]:
    """Popen arguments that run a child as its owner: uid, gid and supplementary groups.

    Only root can switch; a single-user daemon runs everything as itself.
    """
    if os.geteuid() != 0 or uid == 0:
        return {}
    return {"user": uid, "group": gid, "extra_groups": groups}
