"""The cluster's pure decisions: who schedules, when a node fences itself, the cluster's
plan inputs, and the policy's rules for several servers (a job's GPUs on one node,
a job restricted to some nodes)."""

from __future__ import annotations

from gpusched.core.models import GpuHealth, GpuState, Job, JobState
from gpusched.scheduling.cluster.election import (
    Role,
    fence_margin,
    may_declare_down,
    scheduler_role,
)
from gpusched.scheduling.cluster.inputs import (
    NodeView,
    allowed_keys,
    cluster_claims,
    cluster_slots,
    node_key,
    node_report,
    split_key,
)
from gpusched.scheduling.policy import GpuSlot, WaitingJob, plan
from gpusched.store import LeaseRow

G = 2**30


def test_the_holder_renews_an_expired_lease_is_taken_another_s_is_followed() -> None:
    assert scheduler_role(None, "a", None) == Role.TAKE
    assert scheduler_role(LeaseRow("a", 3, expired=False), "a", 3) == Role.RENEW
    assert scheduler_role(LeaseRow("b", 3, expired=False), "a", None) == Role.FOLLOW
    assert scheduler_role(LeaseRow("b", 3, expired=True), "a", None) == Role.TAKE
    # Ours from before a restart (another epoch): taken back at once, not renewed.
    assert scheduler_role(LeaseRow("a", 3, expired=False), "a", None) == Role.TAKE
    # Replaced while paused: our epoch is not the row's.
    assert scheduler_role(LeaseRow("b", 4, expired=False), "a", 3) == Role.FOLLOW


def test_the_fence_margin_is_a_third_of_node_timeout_and_at_least_two_polls() -> None:
    # (A node's launch deadline and the declare-down wait that use it: test_cluster_tick.)
    assert fence_margin(30, 2) == 10
    assert fence_margin(4, 1) == 2  # at least two polls
    for timeout, poll in ((30, 2), (4, 0.5), (3, 1), (600, 60)):
        assert 0 < timeout - fence_margin(timeout, poll) < timeout or timeout <= 2 * poll


def _gpu(index: int, free: int = 24 * G) -> GpuState:
    return GpuState(index, f"GPU-{index}", "sim", 24 * G, 24 * G - free, free)


def _view(name: str, gpus: list[GpuState], **kw: object) -> NodeView:
    report = node_report(gpus, kw.get("usage", {}), {}, [], kw.get("missing", []))  # type: ignore[arg-type]
    return NodeView.from_report(name, bool(kw.get("up", True)), report)


def test_two_nodes_with_the_same_uuids_are_distinct_slots() -> None:
    a, b = _view("a", [_gpu(0)]), _view("b", [_gpu(0)], up=False)
    slots = cluster_slots([a, b])
    assert [s.uuid for s in slots] == ["a/GPU-0", "b/GPU-0"]
    assert [s.usable for s in slots] == [True, False]  # b is drained: no new job
    assert split_key(node_key("b", "GPU-0")) == ("b", "GPU-0")


def test_claims_are_keyed_by_node_and_carry_the_node_s_usage() -> None:
    a = _view("a", [_gpu(0)], usage={7: {"GPU-0": 3 * G}})
    job = Job(7, "u", 1, ["x"], "/", JobState.RUNNING, mem=4 * G, gpu_uuids=["GPU-0"], node="a")
    gone = Job(8, "u", 1, ["x"], "/", JobState.RUNNING, mem=4 * G, gpu_uuids=["GPU-0"], node="z")
    (claim,) = cluster_claims([job, gone], [a])
    assert claim.gpu_uuids == ("a/GPU-0",)
    assert claim.used_bytes == {"a/GPU-0": 3 * G}


def test_a_job_goes_only_where_its_user_exists_and_it_is_allowed() -> None:
    a, b = _view("a", [_gpu(0)]), _view("b", [_gpu(0)], missing=["bob"])
    assert allowed_keys("alice", None, [a, b]) == (None, None)
    assert allowed_keys("bob", None, [a, b]) == (frozenset({"a/GPU-0"}), None)
    assert allowed_keys("alice", ["b"], [a, b]) == (frozenset({"b/GPU-0"}), None)
    keys, why = allowed_keys("bob", ["b"], [a, b])
    assert keys == frozenset()
    assert why == "user bob does not exist on node b"
    keys, why = allowed_keys("alice", ["z"], [a, b])
    assert why == "none of its nodes (z) is up"


def _slot(node: str, index: int, free: int = 24 * G) -> GpuSlot:
    return GpuSlot(f"{node}/GPU-{index}", index, 24 * G, free, node=node)


def test_a_multi_gpu_job_takes_its_gpus_on_one_node() -> None:
    # The two roomiest GPUs are on different nodes; b has two with room for the job.
    gpus = [
        _slot("a", 0, 24 * G),
        _slot("a", 1, 2 * G),
        _slot("b", 0, 20 * G),
        _slot("b", 1, 20 * G),
    ]
    result = plan(gpus, [], [WaitingJob(1, 10 * G, gpu_count=2)])
    assert result.placements[0].gpu_uuids == ("b/GPU-0", "b/GPU-1")


def test_a_job_restricted_to_some_gpus_waits_for_them() -> None:
    gpus = [_slot("a", 0, 24 * G), _slot("b", 0, 2 * G)]
    only_b = WaitingJob(1, 10 * G, gpu_keys=frozenset({"b/GPU-0"}))
    anywhere = WaitingJob(2, 10 * G)
    result = plan(gpus, [], [only_b, anywhere])
    assert [(p.job_id, p.gpu_uuids) for p in result.placements] == [(2, ("a/GPU-0",))]
    assert 1 in result.waiting_reasons


def test_one_named_node_plans_as_one_server() -> None:
    """Slots of one node take the one-server path: the same placements as unnamed ones."""
    frees = [24 * G, 12 * G, 13 * G]
    waiting = [WaitingJob(i, 6 * G, gpu_count=1 + i % 2) for i in range(1, 9)]
    unnamed = plan([_slot("", i, f) for i, f in enumerate(frees)], [], waiting)
    named = plan([_slot("a", i, f) for i, f in enumerate(frees)], [], waiting)
    assert [(p.job_id, [split_key(k)[1] for k in p.gpu_uuids]) for p in named.placements] == [
        (p.job_id, [k.removeprefix("/") for k in p.gpu_uuids]) for p in unnamed.placements
    ]
    assert named.waiting_reasons == unnamed.waiting_reasons


def test_health_survives_the_report() -> None:
    lost = GpuState(0, "GPU-0", "sim", 24 * G, 0, 0, None, GpuHealth.LOST, (), "gone")
    (slot,) = cluster_slots([_view("a", [lost])])
    assert not slot.usable


def test_a_scheduler_back_from_a_gap_waits_before_declaring_nodes_down() -> None:
    assert not may_declare_down(0.0, 30)  # just started, or just reconnected
    assert not may_declare_down(29.9, 30)
    assert may_declare_down(30.0, 30)


def test_in_a_cluster_a_job_is_its_user_name_s_not_its_uid_s() -> None:
    from gpusched.daemon.auth import is_theirs
    from gpusched.daemon.identity import Caller

    job = Job(1, "alice", 1001, ["x"], "/")  # submitted where alice is uid 1001
    alice_elsewhere = Caller(10, 2001, 2001, "alice", admin=False)
    bob_with_that_uid = Caller(11, 1001, 1001, "bob", admin=False)
    assert not is_theirs(job, alice_elsewhere) and is_theirs(job, bob_with_that_uid)  # one server
    assert is_theirs(job, alice_elsewhere, by_name=True)
    assert not is_theirs(job, bob_with_that_uid, by_name=True)
