"""Whether one poll shows an interactive job using its GPU, not using it, or neither.

`interactive.idle_timeout` ends (or flags) a job that leaves its GPU unused; ending one
that works is worse than keeping one that does not, so a poll counts only on evidence
(docs/operations.md, "Security model": the idle rule):

- BUSY: the driver's per-process sample of the job's processes on a card it holds is at
  least IDLE_UTIL_PERCENT, or, where the driver samples no process on that card, the
  job is alone on it (no other process holds memory there) and the card's own
  utilization is at least IDLE_UTIL_PERCENT;
- QUIET: the job holds no GPU memory at all; or every card it holds says it is unused:
  its per-process sample is under the threshold, or the card is sampled per process
  (others have samples) and the job has none this poll, or it is alone on a card
  sampled only whole and that card is under the threshold;
- UNKNOWN: anything else: a card it shares where the driver samples no process (the
  card's utilization is its neighbours' too), or no utilization read at all.

A missing sample is not idleness at one poll (a 3 %-busy job had no sample in 13 of 17
polls on a real card): the idle clock runs only through QUIET polls since the last BUSY
one, and an UNKNOWN poll restarts it (InteractiveJobs.observe_idle). A card kept busy by
others no longer keeps an idle job "active" (the card's utilization counts only for a
job alone on it), and a 1 % keep-alive kernel is under IDLE_UTIL_PERCENT (2 %).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpusched.core.models import GpuProcess, GpuState, _StrEnum

# Under this utilization (percent) a poll says the job is not using its GPU: above a 1 %
# keep-alive kernel (which kept an idle job "active"), below a 3 %-busy real job.
IDLE_UTIL_PERCENT = 2.0


class Evidence(_StrEnum):
    BUSY = "busy"
    QUIET = "quiet"
    UNKNOWN = "unknown"


def _card(
    pids: set[int],
    gpu: GpuState | None,
    per_pid: Mapping[int, int] | None,
) -> Evidence:
    if per_pid is not None:
        mine = sum(per_pid.get(pid, 0) for pid in pids)
        if mine >= IDLE_UTIL_PERCENT:
            return Evidence.BUSY
        if per_pid:  # sampled per process there: the job's share (or none) is under it
            return Evidence.QUIET
        # An empty table: nothing ran on the card since the last poll, or the driver
        # keeps no per-process samples there; the card's own figure decides if alone.
    if gpu is None or gpu.util_percent is None:
        return Evidence.UNKNOWN
    alone = all(process.pid in pids for process in gpu.processes)
    if not alone:
        return Evidence.UNKNOWN
    return Evidence.BUSY if gpu.util_percent >= IDLE_UTIL_PERCENT else Evidence.QUIET


def poll_evidence(
    holding: Mapping[str, Sequence[GpuProcess]] | None,
    gpus: Iterable[GpuState],
    process_util: Mapping[str, Mapping[int, int]] | None,
) -> Evidence:
    """One poll's evidence for one job: `holding` maps each card it holds memory on to
    its processes there; `process_util` is the driver's per-process samples by card."""
    if not holding:
        return Evidence.QUIET  # no GPU memory held: nothing of it runs on a GPU
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    seen = set()
    for uuid, processes in holding.items():
        per_pid = None if process_util is None else process_util.get(uuid)
        seen.add(_card({p.pid for p in processes}, by_uuid.get(uuid), per_pid))
    if Evidence.BUSY in seen:
        return Evidence.BUSY
    return Evidence.UNKNOWN if Evidence.UNKNOWN in seen else Evidence.QUIET
