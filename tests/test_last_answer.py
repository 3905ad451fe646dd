"""What a pass derives from a long queue is kept while the queue is the very same tuple
(gpusched.scheduling.last_answer), and only then: a changed queue, an equal one built
anew, or a list (which can change under the same identity) is answered anew."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched.scheduling.admission import admit
from gpusched.scheduling.last_answer import LastAnswer
from gpusched.store import Queued

G = 2**30


def queued(job_id: int, after: list[int] | None = None) -> Queued:
    return Queued(job_id, "alice", G, 1, 0, after or [], None, None, None, None)


def test_the_very_same_tuple_is_answered_once() -> None:
    asked: list[Sequence[int]] = []

    def total(numbers: Sequence[int]) -> int:
        asked.append(numbers)
        return sum(numbers)

    answer = LastAnswer(total)
    queue = tuple(range(1, 4))
    assert (answer(queue), answer(queue)) == (6, 6)
    assert len(asked) == 1
    assert answer(tuple(range(1, 4))) == 6  # equal, not the same: asked again
    assert answer((1, 2, 4)) == 7
    assert len(asked) == 3


def test_a_list_is_answered_anew_each_time() -> None:
    answer: LastAnswer[int, int] = LastAnswer(sum)
    numbers = [1, 2]
    assert answer(numbers) == 3
    numbers.append(3)  # the same list, changed: a kept answer would be wrong
    assert answer(numbers) == 6


def test_admit_sees_a_dependency_in_a_new_queue_after_an_unchanged_one() -> None:
    def nothing_ended(_ids: object) -> dict[int, object]:
        return {}

    plain = (queued(1), queued(2))
    first = admit(plain, nothing_ended)  # type: ignore[arg-type]
    again = admit(plain, nothing_ended)  # type: ignore[arg-type]
    assert first.eligible is plain and again.eligible is plain  # nothing copied
    with_after = (queued(1), queued(2), queued(3, after=[99]))  # 99: no such job
    admitted = admit(with_after, nothing_ended)  # type: ignore[arg-type]
    assert [job.id for job in admitted.eligible] == [1, 2, 3]  # an unknown dependency: runs
    assert admit(plain, nothing_ended).eligible is plain  # type: ignore[arg-type]
