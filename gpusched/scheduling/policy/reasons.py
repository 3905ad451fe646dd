"""Every waiting job's reason in one plan, said once and remembered by ask.

Jobs that ask for the same thing (memory, cards, cards allowed, --exclusive, --time: the
job's `ask`) get the same "no" until a placement or a claim changes the cards, so a pass
over 10,000 waiting jobs stays cheap: the reason of an ask that found too few cards
behind the head's claim (`no_room`), the reason built from the cards (`why`, on `Claims`
built once per change), and the held reason of an ask of unknown demand behind the job
the quieter cards are kept for (`held_unknown`). `forget` drops them when claims change,
`forget_placed` also what runs on the cards (`busy_text`). Which jobs were held for a
quieter card in this plan is noted here too (`held_for_quieter`), since a remembered
reason holds them as well. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpusched.scheduling.policy.budget import PlanGpu
from gpusched.scheduling.policy.data import Ask, WaitingJob
from gpusched.scheduling.policy.head_claim import Kept
from gpusched.scheduling.policy.quieter import SHOWN_CARDS, busy_cards, kept_quiet, so_far
from gpusched.scheduling.policy.settings import Settings
from gpusched.scheduling.policy.why_not import Claims, why_not


class WaitingReasons:
    __slots__ = (
        "_busy_text",
        "_claims",
        "_why",
        "held_for_quieter",
        "held_unknown",
        "no_room",
        "said",
    )

    def __init__(self) -> None:
        self.said: dict[int, str] = {}  # job id -> its reason in this plan
        self.held_for_quieter: set[int] = set()
        self.no_room: dict[Ask, str] = {}  # asks that found too few cards behind the head
        self.held_unknown: dict[Ask, tuple[str, str]] = {}  # the reason around "so far"
        self._why: dict[Ask, str] = {}
        self._claims: Claims | None = None  # None: build it when next needed
        self._busy_text: dict[tuple[int, ...], str] = {}  # what runs on a held job's cards

    def say(self, job_id: int, reason: str) -> None:
        self.said[job_id] = reason

    def told_before(self, job: WaitingJob) -> str | None:
        """The reason a job with the same ask got since the cards last changed, where it
        holds for this one too (asked after its caps)."""
        held_unknown = self.held_unknown
        if held_unknown and job.demand is None and not job.share:
            held = held_unknown.get(job.ask)
            if held is not None:
                self.held_for_quieter.add(job.job_id)
                return f"{held[0]}{so_far(job) if job.waited_s >= 60 else ''}{held[1]}"
        no_room = self.no_room
        return no_room.get(job.ask) if no_room else None

    def why(
        self,
        job: WaitingJob,
        gpus: list[PlanGpu],
        kept: Kept | None,
        quiet_kept: Mapping[str, int],
        *,
        by_uuid: Mapping[str, PlanGpu],
        settings: Settings,
    ) -> str:
        """`why_not` for `job`'s ask, and the quieter cards it would fit on if any."""
        key = job.ask
        said = self._why.get(key)
        if said is None:
            nodes = settings.several_nodes
            if self._claims is None:
                self._claims = Claims.of(gpus, kept, settings.max_jobs_per_gpu, nodes, quiet_kept)
            said = why_not(job, self._claims, settings.busy_util, nodes)
            if quiet_kept:
                said += kept_quiet(job, quiet_kept, by_uuid, nodes)
            self._why[key] = said
        return said

    def busy_text(self, found: Sequence[PlanGpu], several_nodes: bool) -> str:
        """What runs on the first cards found: the same for every held job that fits on
        as many cards, until a placement changes them."""
        shown = (len(found), *map(id, found[:SHOWN_CARDS]))
        text = self._busy_text.get(shown)
        if text is None:
            text = self._busy_text[shown] = busy_cards(found, several_nodes)
        return text

    def forget(self) -> None:
        """The cards claimed changed: no remembered answer holds."""
        self._claims = None
        self._why.clear()
        self.held_unknown.clear()
        self.no_room.clear()

    def forget_placed(self) -> None:
        """A job was placed: what runs on its cards changed too."""
        self.forget()
        self._busy_text.clear()
