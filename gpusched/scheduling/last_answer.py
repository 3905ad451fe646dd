"""What a pass derives from a long queue, kept while the queue is the very same tuple.

The store hands back the same tuple of queued jobs while the queue is unchanged (store
`queued()`), and the one-server placer the same tuple of their views (`WaitingJobs.views`):
a pass over a long queue that did not change (most passes of a full server: each poll, each
end that starts nothing) would otherwise scan and sort 10,000 jobs again for the same
answers. Only a tuple counts: it cannot change under the same identity (a list can), and
holding it keeps its identity from being reused. One (question, answer) pair, replaced
whole: passes in several threads (a cluster's, a test's) at worst miss it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class LastAnswer(Generic[Item, Answer]):
    """`answer(sequence)`, kept for the very same tuple asked again; never copied: an answer
    the caller changes must be copied by the caller."""

    def __init__(self, answer: Callable[[Sequence[Item]], Answer]) -> None:
        self._answer = answer
        self._last: tuple[tuple[Item, ...], Answer] | None = None

    def __call__(self, asked: Sequence[Item]) -> Answer:
        last = self._last
        if last is not None and asked is last[0]:
            return last[1]
        answer = self._answer(asked)
        if isinstance(asked, tuple):
            self._last = (asked, answer)
        return answer
