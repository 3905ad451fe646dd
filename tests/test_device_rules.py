"""Which device nodes a job's cgroup denies: the other cards' and their MIG capabilities'.

The rules are read from the driver's files in /proc; here a directory laid out as the
NVIDIA driver lays out /proc/devices and /proc/driver/nvidia/capabilities stands in for it.
"""

from __future__ import annotations

from pathlib import Path

from gpusched.gpus.probe import SimulatedProbe
from gpusched.processes.devices import deny_rules

CAPS_MAJOR = 508


def _proc(tmp_path: Path, caps: bool = True) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    lines = ["Character devices:", "  1 mem", "195 nvidia-frontend", "511 nvidia-uvm"]
    if caps:
        lines.append(f"{CAPS_MAJOR} nvidia-caps")
    (proc / "devices").write_text("\n".join([*lines, "", "Block devices:", "  8 sd", ""]))
    # Card minor 2 is split in MIG instances: each has an `access` file naming its node.
    gpu = proc / "driver" / "nvidia" / "capabilities" / "gpu2" / "mig"
    for where, minor in (("gi1", 21), ("gi1/ci0", 22), ("gi2", 30)):
        (gpu / where).mkdir(parents=True)
        (gpu / where / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
    (proc / "driver" / "nvidia" / "capabilities" / "mig").mkdir()  # the global caps
    (proc / "driver" / "nvidia" / "capabilities" / "mig" / "config").write_text(
        "DeviceFileMinor: 1\n"
    )
    return proc


def test_each_other_card_s_node_and_its_mig_nodes_are_denied(tmp_path: Path) -> None:
    rules = deny_rules([2, 0], _proc(tmp_path))
    assert rules == [
        "c 195:0 rwm",
        "c 195:2 rwm",
        f"c {CAPS_MAJOR}:21 rwm",
        f"c {CAPS_MAJOR}:22 rwm",
        f"c {CAPS_MAJOR}:30 rwm",
    ]
    # Nothing but cards: not the control nodes (195:255, 195:254), nvidia-uvm, the
    # global MIG capabilities (config, monitor).
    assert not [r for r in rules if r.startswith(("c 195:25", "c 511:", f"c {CAPS_MAJOR}:1 "))]


def test_without_the_caps_driver_only_the_cards_nodes_are_denied(tmp_path: Path) -> None:
    assert deny_rules([2], _proc(tmp_path, caps=False)) == ["c 195:2 rwm"]


def test_simulated_cards_have_no_nodes_so_nothing_is_denied() -> None:
    assert SimulatedProbe([2**30, 2**30]).device_minors() == {}
    assert deny_rules([]) == []
