"""Prometheus metrics: `metrics: 127.0.0.1:9400` in the config serves /metrics.

A custom collector computes every value at scrape time from the owners of the facts:
the scheduler's latest GPU reading (the same numbers `status` shows) and the job store's
named reads (gpusched.store.queries: this module runs no SQL of its own).
Nothing is counted on the side, so the metrics cannot drift from `status`, and they
survive a daemon restart because they come from the database.

    gpusched_gpu_memory_{total,used,free,reserved,available}_bytes   per GPU
    gpusched_gpu_memory_used_by_{jobs,others}_bytes                 per GPU
    gpusched_gpu_utilization_percent                                per GPU (when known)
    gpusched_gpu_state{state}                                       1 for the GPU's state
    gpusched_gpu_jobs                                               running gpusched jobs
    gpusched_jobs{state,user}                                       jobs in the database
    gpusched_queue_wait_seconds                                     histogram, submit->start
    gpusched_jobs_ended_total{reason}                               ended jobs by reason

Only the daemon imports this module (and prometheus_client), and only when metrics are on.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpusched.core.models import JobState
from gpusched.core.requests.protocol import VERSION
from gpusched.daemon.httpserve import Request, Response, Route, host_checked
from gpusched.scheduling.scheduler import Scheduler

# Queue waits run from seconds (an idle server) to days (a full one).
WAIT_BUCKETS_S = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    3 * 3600.0,
    6 * 3600.0,
    12 * 3600.0,
    86400.0,
    2 * 86400.0,
    7 * 86400.0,
)

_GPU_LABELS = ["node", "gpu", "uuid", "name"]


class GpuschedCollector(Collector):
    """Reads the scheduler and the store on every scrape."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def describe(self) -> list[Metric]:
        # Nothing to declare up front: registering must not run a scrape.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        nodes = GaugeMetricFamily(
            "gpusched_node_up", "1 if the node is up (0: down or drained)", labels=["node"]
        )
        for node in self.scheduler.nodes():
            nodes.add_metric([node.name], 1 if node.state == "up" else 0)
        yield nodes
        yield from self._jobs()
        info = GaugeMetricFamily("gpusched_info", "gpusched daemon version", labels=["version"])
        info.add_metric([VERSION], 1)
        yield info

    def _gpus(self) -> Iterator[Metric]:
        running = [j for j in self.scheduler.store.jobs.active() if j.state == JobState.RUNNING]
        here = self.scheduler.node_name  # every daemon exports its own server's GPUs
        reports = [g for g in self.scheduler.gpu_reports(running) if g.node == here]
        memory = {
            key: GaugeMetricFamily(
                f"gpusched_gpu_memory_{key}_bytes", help_text, labels=_GPU_LABELS
            )
            for key, help_text in (
                ("total", "GPU memory in total"),
                ("used", "GPU memory in use, as the driver reports it"),
                ("free", "GPU memory free, as the driver reports it"),
                ("reserved", "GPU memory held for running gpusched jobs beyond what they use yet"),
                ("available", "GPU memory the next gpusched job could get"),
                ("used_by_jobs", "GPU memory used by gpusched jobs' processes"),
                ("used_by_others", "GPU memory used by processes gpusched did not start"),
            )
        }
        util = GaugeMetricFamily(
            "gpusched_gpu_utilization_percent", "GPU utilization (0-100)", labels=_GPU_LABELS
        )
        state = GaugeMetricFamily(
            "gpusched_gpu_state",
            "1 for the GPU's current state (ok, lost, excluded)",
            labels=[*_GPU_LABELS, "state"],
        )
        count = GaugeMetricFamily(
            "gpusched_gpu_jobs", "gpusched jobs running on the GPU", labels=_GPU_LABELS
        )
        for gpu in reports:
            labels = [here, str(gpu.index), gpu.uuid, gpu.name]
            for key, family in memory.items():
                family.add_metric(labels, float(getattr(gpu, key)))
            if gpu.util is not None:
                util.add_metric(labels, float(gpu.util))
            state.add_metric([*labels, gpu.state], 1)
            count.add_metric(labels, len(gpu.jobs))
        yield from memory.values()
        yield from (util, state, count)

    def _jobs(self) -> Iterator[Metric]:
        figures = self.scheduler.store.jobs.job_figures()
        jobs = GaugeMetricFamily(
            "gpusched_jobs", "gpusched jobs by state and user", labels=["state", "user"]
        )
        for (job_state, user), n in figures.by_state_and_user.items():
            jobs.add_metric([str(job_state), user], n)
        yield jobs
        ended = CounterMetricFamily(
            "gpusched_jobs_ended", "gpusched jobs ended, by reason", labels=["reason"]
        )
        for reason, n in figures.ended_by_reason.items():
            ended.add_metric([reason or "unknown"], n)
        yield ended
        yield _histogram(
            "gpusched_queue_wait_seconds",
            "Time from submit to start of gpusched jobs",
            figures.queue_waits_s,
        )


def _histogram(name: str, help_text: str, values: list[float]) -> Metric:
    counts = [0] * len(WAIT_BUCKETS_S)
    for value in values:
        for i, bound in enumerate(WAIT_BUCKETS_S):
            if value <= bound:
                counts[i] += 1
                break
    cumulative: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(WAIT_BUCKETS_S, counts, strict=True):
        total += n
        cumulative.append((floatToGoString(bound), total))
    cumulative.append(("+Inf", len(values)))
    return HistogramMetricFamily(
        name, help_text, buckets=cumulative, sum_value=max(0.0, sum(values))
    )


def metrics_routes(scheduler: Scheduler, own_host: str) -> dict[str, Route]:
    """/metrics, for gpusched's own bounded HTTP server (httpserve.HttpServer), with the
    dashboard's Host check (`own_host`: the host of `metrics:`): through DNS rebinding a
    page of another site read user names and job counts.

    Not prometheus_client's server: that one gives each connection a thread with no cap
    and no timeout, so idle connections to the port used up the daemon's open files.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuschedCollector(scheduler))

    def scrape(_request: Request) -> Response:
        return Response(200, CONTENT_TYPE_LATEST, generate_latest(registry))

    return {"/metrics": host_checked(scrape, own_host)}
