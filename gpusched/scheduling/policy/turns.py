"""Turns: the order jobs are considered in, by fair share, and how a passed job is told.

Each user's recent use (`decayed_usage`: GPU memory-time,
decayed by a half-life, from `UsageSpan`s) orders the turns; `in_turns` gives the jobs an
administrator put first and each user's own queue (priority, then submit order); a job
that other users' later jobs passed in this plan is told whose (`passed_by`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

from gpusched.scheduling.last_answer import LastAnswer
from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import WaitingJob


def submit_place(job: WaitingJob) -> int:
    """A job's place in submit order: its id, except that an OOM retry (a new job) keeps
    the place of its first attempt (`queue_order`), so retrying never sends it to the back."""
    return job.job_id if job.queue_order is None else job.queue_order


def in_turns(
    waiting: Sequence[WaitingJob], usage: Mapping[str, float]
) -> tuple[list[WaitingJob], dict[str, list[WaitingJob]]]:
    """The jobs an administrator put first (in that order), and each user's own queue
    (fresh lists: the caller takes them apart)."""
    topped, queues = _turns_of(waiting)
    return list(topped), {user: list(queue) for user, queue in queues.items()}


def _in_turns(
    waiting: Sequence[WaitingJob],
) -> tuple[list[WaitingJob], dict[str, list[WaitingJob]]]:
    tops = list(map(_top, waiting))
    if tops.count(None) == len(tops):  # nobody put first: C loops over a long queue
        topped: list[WaitingJob] = []
        plain = list(waiting)
    else:
        topped = sorted(
            (j for j in waiting if j.top is not None), key=lambda j: (j.top, submit_place(j))
        )
        plain = [j for j in waiting if j.top is None]
    # Each user's jobs in the order given (a stable sort by user keeps it), for `_sort_own`.
    users = set(map(_user, plain))
    if len(users) == 1:  # one user: the queue is theirs as it stands (a common long queue)
        queues = {users.pop(): plain}
    else:
        plain.sort(key=_user)
        queues = {user: list(jobs) for user, jobs in groupby(plain, key=_user)}
    for queue in queues.values():
        _sort_own(queue)
    return topped, queues


# The turns of the views last asked about (scheduling.last_answer): an unchanged queue's
# views are the placer's very same tuple, and a long queue's scans and sorts are most of
# its turns' cost.
_turns_of: LastAnswer[WaitingJob, tuple[list[WaitingJob], dict[str, list[WaitingJob]]]] = (
    LastAnswer(_in_turns)
)


def _sort_own(queue: list[WaitingJob]) -> None:
    """A user's queue best last (popped from the end), as
    `queue.sort(key=lambda j: (-j.priority, submit_place(j)), reverse=True)` sorts it (ties
    too: a sort is stable, and stays so reversed), in two sorts on plain attributes: a
    long queue's sort is then the C sort's alone, not a Python call per job."""
    places = list(map(_queue_order, queue))
    if places.count(None) == len(places):  # no OOM retry: the place is the id
        queue.sort(key=_job_id, reverse=True)
    else:
        queue.sort(key=submit_place, reverse=True)
    queue.sort(key=_priority)


_top = attrgetter("top")
_user = attrgetter("user")
_queue_order = attrgetter("queue_order")
_job_id = attrgetter("job_id")
_priority = attrgetter("priority")


@dataclass(frozen=True)
class UsageSpan:
    """A job's hold on GPU memory over time, for fair share (seconds since any epoch)."""

    user: str
    bytes_held: int  # declared memory summed over its GPUs
    start_s: float
    end_s: float | None  # None: still running


def decayed_usage(spans: Sequence[UsageSpan], now_s: float, half_life_s: float) -> dict[str, float]:
    """Each user's GPU memory-time, every instant weighted by 2^-(age / half_life).

    The integral of bytes * 2^-((now - t)/h) from start to end, in closed form, so the
    figure is derived from the job rows alone and survives a daemon restart.
    """
    scale = half_life_s / math.log(2)
    usage: dict[str, float] = {}
    for span in spans:
        end = now_s if span.end_s is None else min(span.end_s, now_s)
        start = min(span.start_s, end)
        weight = 2 ** (-(now_s - end) / half_life_s) - 2 ** (-(now_s - start) / half_life_s)
        usage[span.user] = usage.get(span.user, 0.0) + span.bytes_held * scale * weight
    return usage


def passed_by(
    job: WaitingJob,
    taken: Mapping[str, Sequence[tuple[int, str, int, int | None]]],
    by_uuid: Mapping[str, PlanGpu],
) -> str | None:
    """When other users' jobs submitted after `job` took, in this plan, room it would have
    fitted in (fair share: users take turns, the least recent user first), say whose."""
    if job.mem_bytes is None:
        return None
    fitted = 0
    passed: list[tuple[str, int, int]] = []  # (user, job id, GPU index)
    its_place, owner = submit_place(job), job.user  # asked once, not once per placement
    for uuid, took in taken.items():
        later = [t for t in took if t[1] != owner and t[0] > its_place]
        if not later:
            continue
        gpu = by_uuid[uuid]
        if job.gpu_keys is not None and uuid not in job.gpu_keys:
            continue
        freed = sum(mem for _, _, _, mem in later if mem is not None)
        if any(mem is None for _, _, _, mem in later) or gpu.available + freed >= job.mem_bytes:
            fitted += 1
            passed.extend((user, other, gpu.slot.index) for _, user, other, _ in later)
    if fitted < job.gpu_count or not passed:
        return None
    named = ", ".join(
        f"{user}'s job {other} on GPU {index}" for user, other, index in sorted(set(passed))[:3]
    )
    return f"fair share went first: {named} (users take turns, less recent GPU use first)"


class PassedOn:
    """What other users' jobs took in this plan, per card (their place in submit order,
    user, job id, memory), so that a job they passed by taking turns is told so."""

    def __init__(self) -> None:
        self.taken: dict[str, list[tuple[int, str, int, int | None]]] = {}
        self.latest_by_user: dict[str, int] = {}  # the latest submit place that took a card

    def note(self, job: WaitingJob, gpu: PlanGpu) -> None:
        """`job` took `gpu` in its turn (an administrator's `top` is no turn: not noted)."""
        place = submit_place(job)
        self.taken.setdefault(gpu.slot.uuid, []).append(
            (place, job.user, job.job_id, job.mem_bytes)
        )
        self.latest_by_user[job.user] = max(self.latest_by_user.get(job.user, 0), place)

    def passed(self, job: WaitingJob, by_uuid: Mapping[str, PlanGpu]) -> str | None:
        """`passed_by`, asked only where another user's later job took a card at all."""
        latest = self.latest_by_user
        if not latest:
            return None
        its_place = submit_place(job)
        if not any(u != job.user and p > its_place for u, p in latest.items()):
            return None
        return passed_by(job, self.taken, by_uuid)
