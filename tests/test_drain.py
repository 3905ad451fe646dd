"""The drain record in the state directory (gpusched.scheduling.drain): kept, lifted, and read
carefully when damaged."""

from __future__ import annotations

from pathlib import Path

from gpusched.core.models import Drain
from gpusched.scheduling.drain import DRAIN_FILE, load_drain, save_drain


def test_a_drain_is_kept_and_lifted(tmp_path: Path) -> None:
    assert load_drain(tmp_path) is None
    drain = Drain("root", "2026-11-22T05:00:00.000+00:00", "disk swap")
    save_drain(tmp_path, drain)
    assert load_drain(tmp_path) == drain
    assert (tmp_path / DRAIN_FILE).stat().st_mode & 0o077 == 0  # the daemon's own
    save_drain(tmp_path, None)
    assert load_drain(tmp_path) is None
    save_drain(tmp_path, None)  # lifting twice is fine


def test_a_damaged_record_keeps_the_server_drained(tmp_path: Path) -> None:
    # Half-written or edited by hand: starting jobs on a server someone meant to drain
    # would be the worse mistake.
    (tmp_path / DRAIN_FILE).write_text('{"by": "ro')
    drain = load_drain(tmp_path)
    assert drain is not None and "unreadable" in (drain.reason or "")
