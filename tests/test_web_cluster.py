"""The dashboard of a cluster (issue 18: "every node of the cluster"), in a real browser:
two daemons sharing one queue (an SQLite file), the page served by one of them shows
both servers with their own GPUs, and a job's GPU is named with its node."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium, console_errors, free_port, require_chromium
from tests.cluster_harness import cluster_config
from tests.daemon_harness import eventually

RUNNING_CELLS_JS = (
    "return Array.from(document.querySelectorAll('#running td'), td => td.textContent)"
)
NODES_JS = """
return Array.from(document.querySelectorAll('section.node'), node => ({
  name: node.dataset.node,
  state: node.querySelector('.node-state').textContent,
  gpus: Array.from(node.querySelectorAll('.gpu'), gpu => Number(gpu.dataset.index)),
}));
"""


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    require_chromium()


def test_every_node_with_its_gpus_and_a_jobs_node(daemon_factory: Any, tmp_path: Path) -> None:
    shared = f"sqlite:///{tmp_path / 'shared' / 'queue.db'}"
    port = free_port()
    a = daemon_factory("a", config=cluster_config(shared, "a", web=f"127.0.0.1:{port}"))
    b = daemon_factory("b", simulate="1x40G", config=cluster_config(shared, "b"))
    a.start()
    b.start()
    job = a.submit("--mem", "30G", "--", sys.executable, "-c", "import time; time.sleep(600)")
    a.wait_state(job, {"running"})
    assert a.show(job)["node"] == "b"  # only b's 40G card holds 30G
    url = f"http://127.0.0.1:{port}"
    with chromium() as driver:
        driver.get(url + "/")
        expected = [
            {"name": n["name"], "state": n["state"], "gpus": [g["index"] for g in n["gpus"]]}
            for n in a.status()["nodes"]
        ]
        assert [n["name"] for n in expected] == ["a", "b"]
        eventually(
            lambda: driver.execute_script(NODES_JS) == expected,
            20,
            describe=lambda: (driver.execute_script(NODES_JS), expected),
        )
        driver.get(url + "/queue")
        eventually(
            lambda: driver.execute_script(RUNNING_CELLS_JS).count("b:0") == 1,
            20,
        )
        assert console_errors(driver) == []
