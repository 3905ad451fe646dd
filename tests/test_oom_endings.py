"""Out of memory only when it was one: how a failed job's end is judged, one tick at a time.

The real scheduler and store on the test doubles of tests/fakes.py (built by
tests/test_tick.py's `make_world`): the fake GPUs show what the test says each job holds,
the job's log is what the test writes, and its supervisor reports the exit the test picks.
The rules are gpusched.usage.oom's; these tests see only what a user sees (state, reason,
reason_detail, the retry and its --mem).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.models import EndReason, JobState
from gpusched.processes.launching import Outcome, OutcomeKind
from tests.fakes import GiB
from tests.test_tick import World, make_world

MiB = 2**20
EXIT_1 = Outcome(OutcomeKind.EXIT, exit_code=1)


def _pack(world: World, sizes: list[int], holds: list[int] | None = None) -> list[int]:
    """Start one job per size on GPU 0, each holding what it declared (or `holds`)."""
    jobs = [world.submit(size, retry_oom=1) for size in sizes]
    world.tick()
    for job, held in zip(jobs, holds or sizes, strict=True):
        assert world.gpus_of(job) == [0]
        world.probe.hold(world.launcher.running[job], 0, held)
    world.tick()  # a poll that sees them
    return jobs


def _fail(world: World, job: int, log: str, outcome: Outcome = EXIT_1) -> None:
    world.launcher.log_path(job).write_text(log)
    world.finish(job, outcome)


# Finding 5: a card packed to just above what gpusched hands out is not "full".
@pytest.mark.parametrize(
    ("card", "free"),
    [
        (80 * GiB, GiB),  # the card: 1G free, under the old 2 % (1.6G)
        (24 * GiB, 400 * MiB),  # under the old floor of max(256M, 2 % = 480M)
        (48 * GiB, 300 * MiB),  # above half the 512M headroom: a small allocation still fits
    ],
)
def test_an_ordinary_failure_on_a_card_packed_to_the_headroom_is_not_oom(
    tmp_path: Path, card: int, free: int
) -> None:
    world = make_world(tmp_path, [card], headroom="512M")
    first = card - free - 10 * GiB
    big, small = _pack(world, [first - 512 * MiB, 10 * GiB], [first, 10 * GiB])
    _fail(world, small, "Traceback (most recent call last):\nKeyError: 'label'\n")
    ended = world.job(small)
    assert (ended.state, ended.reason, ended.exit_code) == (JobState.FAILED, EndReason.EXIT, 1)
    assert ended.retried_as is None
    assert world.state(big) == JobState.RUNNING


def test_a_card_with_under_half_the_headroom_free_is_still_oom(tmp_path: Path) -> None:
    world = make_world(tmp_path, [24 * GiB], headroom="512M")
    (job,) = _pack(world, [16 * GiB])
    world.probe.hold(4242, 0, 8 * GiB - 200 * MiB)  # someone else fills the card: 200M free
    world.tick()
    _fail(world, job, "Segmentation fault\n")
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.OOM)
    assert "GPU 0 was full: 200M of 24G free" in (ended.reason_detail or "")


def test_a_job_that_went_past_its_declaration_and_died_is_oom(tmp_path: Path) -> None:
    world = make_world(tmp_path, [80 * GiB], headroom="512M")
    (job,) = _pack(world, [8 * GiB], [9 * GiB])  # 70G still free: the card is not full
    _fail(world, job, "Killed\n", Outcome(OutcomeKind.SIGNAL, exit_code=-9))
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.OOM)
    assert "peak 9G went past its --mem 8G" in (ended.reason_detail or "")


# Finding 7: each library's out-of-memory message, as it prints it.
LIBRARY_MESSAGES = {
    "pytorch": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "cublas": (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    "cudnn": "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY",
    "nccl": (
        "node1:1234:1290 [0] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'\n"
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970,"
        " unhandled cuda error"
    ),
    "cupy": (
        "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 4,294,967,296 bytes"
        " (allocated so far: 21,474,836,480 bytes)."
    ),
    "numba": (
        "numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in"
        " CUDA_ERROR_OUT_OF_MEMORY"
    ),
}


@pytest.mark.parametrize("library", sorted(LIBRARY_MESSAGES))
def test_each_librarys_out_of_memory_message_makes_an_oom(tmp_path: Path, library: str) -> None:
    world = make_world(tmp_path, [80 * GiB], headroom="512M")
    (job,) = _pack(world, [8 * GiB])  # used what it declared, on a card with room: only the log
    _fail(
        world,
        job,
        f"step 12 loss 0.4\nTraceback (most recent call last):\n{LIBRARY_MESSAGES[library]}\n",
    )
    ended = world.job(job)
    assert (ended.state, ended.reason) == (JobState.FAILED, EndReason.OOM)
    assert ended.retried_as is not None


# Finding 6: a retry sized above what could ever run waits forever.
def test_an_oom_retry_is_capped_at_the_owners_max_mem(tmp_path: Path) -> None:
    world = make_world(
        tmp_path, [80 * GiB], headroom="512M", limits={"users": {"alice": {"max_mem": "20G"}}}
    )
    (job,) = _pack(world, [16 * GiB])
    _fail(world, job, LIBRARY_MESSAGES["pytorch"] + "\n")
    retry = world.scheduler.store.jobs.latest_attempts([job])[job]
    assert retry.id != job
    assert retry.mem == 20 * GiB  # not 24G, which max_mem would never let start


def test_no_oom_retry_when_max_mem_is_not_above_the_current_mem(tmp_path: Path) -> None:
    max_mem = "12G"
    world = make_world(
        tmp_path, [80 * GiB], headroom="512M", limits={"users": {"alice": {"max_mem": max_mem}}}
    )
    (job,) = _pack(world, [12 * GiB])
    _fail(world, job, LIBRARY_MESSAGES["pytorch"] + "\n")
    ended = world.job(job)
    assert (ended.reason, ended.retried_as) == (EndReason.OOM, None)
    assert f"not retried: 12G is already the most your max_mem {max_mem} allows" in (
        ended.reason_detail or ""
    )
    assert any("not retried" in hint for hint in ended.hints)


def test_a_job_that_asked_no_retry_is_told_why_more_memory_would_not_start(
    tmp_path: Path,
) -> None:
    world = make_world(
        tmp_path, [80 * GiB], headroom="512M", limits={"users": {"alice": {"max_mem": "12G"}}}
    )
    job = world.submit(12 * GiB)  # no --retry-oom
    world.tick()
    _fail(world, job, LIBRARY_MESSAGES["pytorch"] + "\n")
    ended = world.job(job)
    assert ended.reason == EndReason.OOM
    assert "12G is already the most your max_mem 12G allows" in ended.hints[0]
    assert "not retried: " not in (ended.reason_detail or "")  # it asked for none
