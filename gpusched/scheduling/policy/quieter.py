"""The bound on a contention wait: the cards kept for a job held for a quieter card.

The first job in the order held for a quieter card (module contention) keeps the card(s)
whose busy jobs (else, on a card busy only with light jobs, all its jobs) end soonest
(`soonest_quiet`); no job behind it starts there, so it starts once those end. Its reason
says which and until when (`quieter_parts`), and a job that would fit on such a card is
told it is kept (`kept_quiet`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gpusched.core.units import format_duration
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.contention import is_busy_job
from gpusched.scheduling.policy.data import WaitingJob
from gpusched.scheduling.policy.exclusive import fits_now
from gpusched.scheduling.policy.words import gpu_name, job_list

SHOWN_CARDS = 3  # the cards a held job's reason names


def waits_on(gpu: PlanGpu) -> list[int]:
    """The jobs whose end makes this card quieter: its busy ones, else all of them (light
    jobs that add up)."""
    return gpu.busy_with or gpu.job_ids


def soonest_quiet(found: Sequence[PlanGpu], count: int) -> list[PlanGpu]:
    """The cards a job held for a quieter card keeps: those whose busy jobs end soonest
    (by their --time; none: last), then the fewest busy jobs, then the most room."""
    ends = {}
    for gpu in found:
        on = waits_on(gpu)
        left = [end for job_id, _, end in gpu.holds if job_id in on]
        ends[id(gpu)] = max((math.inf if e is None else e for e in left), default=math.inf)
    ordered = sorted(
        found, key=lambda g: (ends[id(g)], len(waits_on(g)), -g.available, g.slot.index)
    )
    return ordered[:count]


def _runs(gpu: PlanGpu) -> str:
    if gpu.busy_with:
        return job_list(gpu.busy_with, "busy ")
    return f"{job_list(gpu.job_ids)} ({gpu.demand:.0%} busy)"


def so_far(job: WaitingJob) -> str:
    return f", for {job.waited_s // 60:.0f} min so far" if job.waited_s >= 60 else ""


def busy_cards(found: Sequence[PlanGpu], several_nodes: bool) -> str:
    """What runs on the cards a held job fits on, for its reason: a status line, not a
    table: the first few in the plan's order (the most room first), then how many more."""
    shown = sorted(found[:SHOWN_CARDS], key=_index)
    busy = "; ".join(f"{gpu_name(g, several_nodes)} runs {_runs(g)}" for g in shown)
    if len(found) > len(shown):
        busy += f"; {len(found) - len(shown)} more cards alike"
    return busy


def quieter_parts(
    job: WaitingJob,
    found: Sequence[PlanGpu],
    quiet_kept: Mapping[str, int],
    by_uuid: Mapping[str, PlanGpu],
    several_nodes: bool,
    *,
    busy: str | None = None,
    own: str | None = None,
) -> tuple[str, str]:
    """A held job's reason before and after how long it has waited: the same for every
    job of unknown demand with the same ask behind the one the cards are kept for (the
    plan reuses it for them until a placement changes the cards). `busy`: `busy_cards`
    of `found`, where the plan has it already; `own`: why it is held, where that is not
    its demand (a `--time` sharing would break: module time_limits)."""
    if busy is None:
        busy = busy_cards(found, several_nodes)
    said = f"waits for a quieter card ({own or _by_demand(job)}; {busy})"
    mine = sorted((by_uuid[u] for u, j in quiet_kept.items() if j == job.job_id), key=_index)
    if not mine:
        ahead = next(iter(quiet_kept.values()))
        return said, f"; behind job {ahead}, held for one too (pack: contention)"
    names = ", ".join(gpu_name(g, several_nodes) for g in mine)
    ending = sorted({j for g in mine for j in waits_on(g)})
    kind = "busy " if all(g.busy_with for g in mine) else ""
    left = [end for g in mine for j, _, end in g.holds if j in waits_on(g)]
    when = ""
    if left and all(end is not None for end in left):
        when = f" (by --time, within {format_duration(max(e or 0.0 for e in left))})"
    return said, (
        f"; {names} kept for it: starts when {job_list(ending, kind)}"
        f" end{'' if len(ending) > 1 else 's'}{when} (pack: contention)"
    )


def _by_demand(job: WaitingJob) -> str:
    """Why contention holds `job`, by its demand."""
    if job.demand is None:
        return "its demand is not known yet, and every card it fits on is past 100 % busy"
    if is_busy_job(job):
        return f"{expected(job)}keeps a card {job.demand:.0%} busy"
    return (
        f"{expected(job)}keeps a card {job.demand:.0%} busy, and no card stays within 100 % with it"
    )


def kept_quiet(
    job: WaitingJob,
    quiet_kept: Mapping[str, int],
    by_uuid: Mapping[str, PlanGpu],
    several_nodes: bool,
) -> str:
    """ "; GPU 2 kept for job 7 (held for a quieter card)" where `job` would fit there."""
    fits = [by_uuid[u] for u in quiet_kept if fits_now(job, by_uuid[u])]
    if not fits:
        return ""
    names = ", ".join(gpu_name(g, several_nodes) for g in sorted(fits, key=_index))
    return f"; {names} kept for job {quiet_kept[fits[0].slot.uuid]} (held for a quieter card)"


def expected(job: WaitingJob) -> str:
    """Who the held job's demand is known from: "it " (its own runs; said as measured for
    a `--share` or interactive job, which they outrank), or its owner's latest runs, said
    as such with how to override them (a new project may differ)."""
    if not job.owner_runs:
        if job.share:
            return (
                "measured in its earlier runs (--share or interactive is light only until"
                " measured): it "
            )
        return "it "
    kind, other = ("busy", "--share") if is_busy_job(job) else ("light", "--exclusive")
    return (
        f"expected {kind}: its owner's last {job.owner_runs} jobs were, and it has no runs of its"
        f" own yet ({other} if it is not): it "
    )


def _index(gpu: PlanGpu) -> int:
    return gpu.slot.index
