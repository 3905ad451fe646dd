"""The pure rules of gpusched.usage.oom: when a failure is an OOM, and its retry's --mem."""

from __future__ import annotations

from gpusched.usage.oom import CardSeen, oom_cause, retry_mem, short_of_memory

GiB = 2**30
MiB = 2**20


def test_short_of_memory_is_under_half_the_headroom() -> None:
    assert short_of_memory(255 * MiB, 512 * MiB)
    assert not short_of_memory(256 * MiB, 512 * MiB)
    assert short_of_memory(0, 0)  # no headroom: only a card with nothing free
    assert not short_of_memory(1, 0)


def test_a_full_card_is_evidence_only_where_the_job_held_memory() -> None:
    empty_handed = CardSeen(0, 0, 24 * GiB, 0)
    assert (
        oom_cause(
            log_tail="", mem=GiB, peak_mem=0, last_card=empty_handed, headroom_bytes=512 * MiB
        )
        is None
    )
    holding = CardSeen(0, 0, 24 * GiB, GiB)
    assert oom_cause(
        log_tail="", mem=2 * GiB, peak_mem=GiB, last_card=holding, headroom_bytes=512 * MiB
    )


def test_a_whole_gpu_job_has_no_declaration_to_go_past() -> None:
    assert (
        oom_cause(log_tail="", mem=None, peak_mem=80 * GiB, last_card=None, headroom_bytes=0)
        is None
    )


def test_card_seen_from_another_versions_state_is_no_evidence() -> None:
    assert CardSeen.from_state(None) is None
    assert CardSeen.from_state({"index": 0}) is None
    assert CardSeen.from_state(
        {"index": 1, "free_bytes": 2, "total_bytes": 3, "held_bytes": 4}
    ) == CardSeen(1, 2, 3, 4)


# Finding 6: the retry is capped at what the submit check accepts (NVML v2 usable memory,
# used + free, less the headroom), not at total - headroom.
def test_the_retry_is_capped_at_the_usable_memory_less_the_headroom() -> None:
    usable = 80 * GiB - 750 * MiB  # an 80G card whose driver keeps 750M (H100-like)
    mem, why = retry_mem(60 * GiB, 1, [usable], 512 * MiB, None)
    assert mem == usable - 512 * MiB
    assert why == ""


def test_a_multi_gpu_retry_is_capped_by_its_nth_largest_card_and_max_mem_per_gpu() -> None:
    sizes = [80 * GiB, 24 * GiB, 24 * GiB]
    mem, _ = retry_mem(16 * GiB, 2, sizes, 0, None)
    assert mem == 24 * GiB
    mem, _ = retry_mem(8 * GiB, 2, sizes, 0, 20 * GiB)
    assert mem == 10 * GiB  # 20G over two GPUs


def test_no_retry_when_the_cap_is_not_above_the_current_mem() -> None:
    mem, why = retry_mem(24 * GiB, 1, [24 * GiB], 0, None)
    assert mem is None
    assert why == "24G is already the most a GPU here gives"
    assert retry_mem(GiB, 3, [24 * GiB], 0, None) == (None, "fewer than 3 GPUs are left")
    assert retry_mem(None, 1, [24 * GiB], 0, None) == (None, "it already had a whole GPU")


def test_the_retry_asks_whole_g_as_the_hints_promise() -> None:
    """1.5x of 1.5G is 2.25G: the retry (and the hint naming it) asks 3G, not 2304M."""
    mem, _ = retry_mem(1536 * MiB, 1, [24 * GiB], 0, None)
    assert mem == 3 * GiB
    mem, _ = retry_mem(GiB, 1, [24 * GiB], 0, None)
    assert mem == 1536 * MiB  # below 2G the step is 256M, as --mem suggestions take
    mem, _ = retry_mem(7 * GiB, 1, [24 * GiB], 0, None)
    assert mem == 11 * GiB  # 10.5G rounded up
