"""What `status` shows of each GPU: its memory split into used, reserved and available.

Built from the scheduler's latest reading with the same budget the policy plans with
(`gpu_budgets`), so `available` is exactly what the next job could get; with what each
job holds on it and who holds the rest (gpusched.gpus.process_owners).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from gpusched.core.models import GpuReport, GpuState, Job
from gpusched.gpus.process_owners import outside_processes
from gpusched.scheduling.policy import gpu_budgets
from gpusched.scheduling.policy_inputs import gpu_slot, running_claim


def gpu_reports(
    gpus: Sequence[GpuState],
    usage: dict[int, dict[str, int]],
    running: Sequence[Job],
    headroom_bytes: int,
    *,
    jobs_pids: Mapping[str, Collection[int]] | None = None,
    seen_pids: Collection[int] = (),
) -> list[GpuReport]:
    """`jobs_pids`: per GPU uuid, the pids the reading of `gpus` found in a running job's
    tree (observe.py's Observation): the job's, even once they have exited. `seen_pids`:
    those whose /proc entry the reading found (one gone since has exited)."""
    claims = [running_claim(j, usage) for j in running]
    budgets = gpu_budgets([gpu_slot(g) for g in gpus], claims, headroom_bytes)
    job_pids = [j.pid for j in running if j.pid is not None]
    reports = []
    for gpu in gpus:
        budget = budgets[gpu.uuid]
        by_jobs = sum(u.get(gpu.uuid, 0) for u in usage.values())
        used = gpu.used_bytes
        reports.append(
            GpuReport(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                total=gpu.total_bytes,
                used=used,
                free=gpu.free_bytes,
                reserved=budget.reserved_bytes,
                available=budget.available_bytes,
                used_by_jobs=by_jobs,
                used_by_others=max(0, used - by_jobs),
                util=gpu.util_percent,
                state=str(gpu.health),
                # Its jobs, and any job holding memory here on a GPU it was not given.
                jobs=[
                    j.id
                    for j in running
                    if gpu.uuid in j.gpu_uuids or usage.get(j.id, {}).get(gpu.uuid)
                ],
                error=gpu.error,
                short=budget.short_bytes,
                job_mem={
                    str(job_id): held[gpu.uuid]
                    for job_id, held in usage.items()
                    if gpu.uuid in held
                },
                others=(
                    outside_processes(
                        gpu.processes, job_pids, (jobs_pids or {}).get(gpu.uuid, ()), seen_pids
                    )
                    if gpu.processes
                    else []
                ),
            )
        )
    return reports
