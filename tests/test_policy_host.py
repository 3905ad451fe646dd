"""The host rule (gpusched.scheduling.policy.host) as the pure policy applies it: jobs'
`--ram` and `--cpus` never reserve more than their server gives, a job that cannot get
them now waits saying how much is free of how much, and a job that asks for neither is
placed as before (the cards alone decide). `pack: memory` where many jobs share few
cards, so that the contention rule's waits (tests/test_policy_placement.py) stay apart."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.scheduling.policy import GpuSlot, HostRoom, RunningClaim, WaitingJob, plan
from gpusched.scheduling.policy.host import default_share, host_capacity, never_fits

GiB = 2**30


def _cards(count: int = 4, size: int = 80 * GiB) -> list[GpuSlot]:
    return [GpuSlot(f"GPU-{i}", i, size, size) for i in range(count)]


asks = st.lists(
    st.tuples(
        st.sampled_from([None, 1, 4, 8, 20, 40]),  # --ram, GiB
        st.sampled_from([None, 1, 2, 4, 8]),  # --cpus
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(asks, st.integers(8, 64), st.integers(1, 16), st.sampled_from([0, 10, 30]))
def test_reservations_stay_within_the_room_and_waits_say_why(
    jobs: list[tuple[int | None, int | None]], ram_gib: int, cores: int, running_gib: int
) -> None:
    room = HostRoom(ram_gib * GiB, cores)
    running = [RunningClaim(99, ("GPU-0",), GiB, ram_bytes=running_gib * GiB or None)]
    waiting = [
        WaitingJob(i, GiB, ram_bytes=None if r is None else r * GiB, cpus=c)
        for i, (r, c) in enumerate(jobs, start=1)
    ]
    result = plan(_cards(), running, waiting, hosts={"": room}, pack="memory")
    placed = {p.job_id for p in result.placements}
    ram = running_gib * GiB + sum(j.ram_bytes or 0 for j in waiting if j.job_id in placed)
    cpus = sum(j.cpus or 0 for j in waiting if j.job_id in placed)
    # The running job may hold more than the room already (the room was made smaller):
    # then nothing that asks for memory starts beside it.
    assert ram <= max(ram_gib, running_gib) * GiB
    assert cpus <= cores
    for job in waiting:
        if job.job_id in placed:
            continue
        reason = result.waiting_reasons[job.job_id]
        assert reason.startswith(("waits for host memory: ", "waits for cores: ")), reason
        if reason.startswith("waits for host memory"):
            assert f"of {ram_gib}G free, needs {(job.ram_bytes or 0) // GiB}G" in reason
        else:
            assert f"of {cores} free, needs {job.cpus}" in reason
    # Jobs that ask for neither: all placed, as without the rule (the cards have room).
    assert {j.job_id for j in waiting if not (j.ram_bytes or j.cpus)} <= placed


@given(asks)
def test_without_a_room_nothing_waits_for_the_host(
    jobs: list[tuple[int | None, int | None]],
) -> None:
    waiting = [
        WaitingJob(i, GiB, ram_bytes=None if r is None else r * GiB, cpus=c)
        for i, (r, c) in enumerate(jobs, start=1)
    ]
    assert len(plan(_cards(), [], waiting, pack="memory").placements) == len(waiting)


def test_a_job_held_for_host_memory_claims_no_card_and_lets_smaller_jobs_by() -> None:
    room = HostRoom(60 * GiB, 8)
    running = [RunningClaim(1, ("GPU-0",), GiB, ram_bytes=40 * GiB)]
    big = WaitingJob(2, GiB, ram_bytes=24 * GiB)
    small = WaitingJob(3, GiB, ram_bytes=16 * GiB)
    result = plan(_cards(2), running, [big, small], hosts={"": room})
    assert [p.job_id for p in result.placements] == [3]
    assert result.waiting_reasons[2] == "waits for host memory: 20G of 60G free, needs 24G"
    assert result.head_claim is None


def test_in_a_cluster_each_node_has_its_own_room() -> None:
    cards = [GpuSlot("GPU-a", 0, 80 * GiB, 80 * GiB, node="a")]
    cards.append(GpuSlot("GPU-b", 0, 80 * GiB, 80 * GiB, node="b"))
    rooms = {"a": HostRoom(16 * GiB, 4), "b": HostRoom(64 * GiB, 4)}
    result = plan(cards, [], [WaitingJob(1, GiB, ram_bytes=32 * GiB)], hosts=rooms)
    assert [p.gpu_uuids for p in result.placements] == [("GPU-b",)]


def test_capacity_is_memory_less_its_reserve_within_the_service() -> None:
    def capacity(total: int, service: int | None = None, reserve_bytes: int = 0) -> HostRoom:
        return host_capacity(
            total,
            service,
            16,
            reserve_fraction=0.1,
            reserve_bytes=reserve_bytes,
            reserve_min_bytes=2 * GiB,
            cpu_reserve=2,
        )

    assert capacity(100 * GiB) == HostRoom(90 * GiB, 14)
    assert capacity(10 * GiB) == HostRoom(8 * GiB, 14)  # at least 2G kept
    assert capacity(100 * GiB, 50 * GiB).ram_bytes == 50 * GiB  # the service's limit
    assert capacity(100 * GiB, reserve_bytes=20 * GiB).ram_bytes == 80 * GiB
    assert capacity(GiB).ram_bytes == GiB // 10  # a tiny machine still gives something


def test_the_default_is_an_equal_share_per_gpu() -> None:
    assert default_share(60 * GiB, 4, 1, None) == 15 * GiB
    assert default_share(60 * GiB, 4, 2, None) == 30 * GiB
    assert default_share(60 * GiB, 4, 8, None) == 60 * GiB  # more GPUs than there are
    assert default_share(16, 4, 1, None) == 4
    assert default_share(3, 4, 1, None) == 1  # at least a core
    assert default_share(16, 4, 2, 3) == 6  # configured per GPU
    assert default_share(16, 4, 4, 8) == 16  # never past the capacity


def test_an_ask_past_the_capacity_never_fits() -> None:
    room = HostRoom(60 * GiB, 8)
    assert never_fits(60 * GiB, 8, room, "this server") is None
    assert never_fits(61 * GiB, None, room, "this server") == (
        "--ram 61G is more than this server gives its jobs (60G of host memory)"
    )
    assert never_fits(None, 9, room, "node a") == (
        "--cpus 9 is more than node a gives its jobs (8 cores)"
    )
    assert never_fits(10**15, 10**4, HostRoom(), "here") is None
