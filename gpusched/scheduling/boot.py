"""Whether the machine restarted since the daemon's last run: after a reboot no job of
the last run can be alive, and a missing log proves nothing (the page cache is gone).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gpusched.processes.durable import write_json_atomically

log = logging.getLogger("gpusched.scheduler")


def rebooted_since_last_run(state_dir: Path) -> bool:
    """Whether the machine restarted since the last daemon run (then remember this boot).

    Unknown (no record yet) counts as a reboot: the careful answer.
    """
    record = state_dir / "boot.json"
    try:
        now = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return True
    try:
        before = json.loads(record.read_text()).get("boot_id")
    except (OSError, ValueError, AttributeError):
        before = None
    if before != now:
        try:
            write_json_atomically(record, {"boot_id": now})
        except OSError as exc:
            log.warning("cannot record the boot id in %s: %s", record, exc)
    return before != now
