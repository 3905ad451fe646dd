"""The Prometheus endpoint of a real daemon, parsed with prometheus-client's own parser."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gpusched.config.settings import load_config
from gpusched.core.errors import UsageError
from tests.daemon_harness import eventually
from tests.http_helpers import free_port, scrape

G = 2**30


def _values(family: Any, name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for sample in family.samples
        if name is None or sample.name == name
    }


def test_metrics_endpoint_serves_the_schedulers_state(daemon_factory: Any) -> None:
    port = free_port()
    daemon = daemon_factory(config={"metrics": f"127.0.0.1:{port}"}).start()
    finished = daemon.submit("--mem", "2G", "--", "true")
    daemon.wait_state(finished, {"done"})
    running = daemon.submit("--mem", "4G", "--", "sleep", "60")
    daemon.wait_state(running, {"running"})
    # Simulated jobs "allocate" what they declared a moment after starting.
    eventually(lambda: sum(g["used"] for g in daemon.status()["gpus"]) == 4 * G)
    status = {g["index"]: g for g in daemon.status()["gpus"]}
    metrics = scrape(port)

    for key in ("total", "used", "free", "reserved", "available", "used_by_jobs", "used_by_others"):
        by_gpu = {
            dict(labels)["gpu"]: value
            for labels, value in _values(metrics[f"gpusched_gpu_memory_{key}_bytes"]).items()
        }
        assert by_gpu == {str(i): float(g[key]) for i, g in status.items()}, key
    # An idle simulated card reads 0 %, one running a job light (the probe's default).
    assert set(_values(metrics["gpusched_gpu_utilization_percent"]).values()) == {0.0, 10.0}
    states = _values(metrics["gpusched_gpu_state"])
    assert all(dict(labels)["state"] == "ok" and v == 1 for labels, v in states.items())
    # One server: its one node, named after its host.
    (node_up,) = _values(metrics["gpusched_node_up"]).items()
    assert node_up == ((("node", socket.gethostname().split(".")[0]),), 1.0)
    assert {dict(labels)["node"] for labels in states} == {dict(node_up[0])["node"]}

    jobs = {
        (dict(k)["state"], dict(k)["user"]): v for k, v in _values(metrics["gpusched_jobs"]).items()
    }
    user = daemon.show(running)["user"]
    assert jobs == {("done", user): 1.0, ("running", user): 1.0}
    ended = metrics["gpusched_jobs_ended"]
    assert ended.type == "counter"
    assert _values(ended, "gpusched_jobs_ended_total") == {(("reason", "exit"),): 1.0}

    wait = metrics["gpusched_queue_wait_seconds"]
    assert wait.type == "histogram"
    assert _values(wait, "gpusched_queue_wait_seconds_count") == {(): 2.0}
    buckets = {
        dict(k)["le"]: v for k, v in _values(wait, "gpusched_queue_wait_seconds_bucket").items()
    }
    assert buckets["+Inf"] == 2.0
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert 0 <= _values(wait, "gpusched_queue_wait_seconds_sum")[()] < 60

    # No second copy: the next scrape sees the next state.
    daemon.cli("cancel", str(running))
    daemon.wait_state(running, {"cancelled"})
    again = scrape(port)
    jobs = {
        (dict(k)["state"], dict(k)["user"]): v for k, v in _values(again["gpusched_jobs"]).items()
    }
    assert jobs == {("done", user): 1.0, ("cancelled", user): 1.0}


def test_metrics_port_in_use_stops_the_daemon_with_a_message(daemon_factory: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        daemon = daemon_factory(config={"metrics": f"127.0.0.1:{port}"})
        with pytest.raises(RuntimeError, match=f"metrics: cannot listen on 127.0.0.1:{port}"):
            daemon.start()


def test_metrics_address_forms(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    for value, expected in (
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("'[::1]:9400'", ("::1", 9400)),
        ("9400", ("127.0.0.1", 9400)),
        ("null", None),
    ):
        path.write_text(f"metrics: {value}\n")
        assert load_config(path).metrics_address == expected
    assert load_config(None).metrics_address is None  # off by default
    path.write_text("metrics: localhost:http\n")
    with pytest.raises(UsageError, match="metrics"):
        load_config(path)
