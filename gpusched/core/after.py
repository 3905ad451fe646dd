"""`submit --after ID[:WHEN],...`: how a dependency must end for its dependent to start
(`AFTER_CONDITIONS`), the option's text read (`parse_after`) and written back
(`after_text`, what `show` prints).

`ok`: the dependency succeeded (`done`), what a plain ID asks; `any`: it ended, however;
`failed`: it ended without succeeding (failed, cancelled, lost: Slurm's afternotok). On
the wire and in the store a job's dependencies are `after`, every id, and `after_when`,
one condition per id in `after`'s order (null when every one is `ok`), so that what
reads only `after` (retention, copying a database, an older client) still sees every id.
Standard library only: the request checks and the CLI import it.
"""

from __future__ import annotations

from gpusched.core.errors import UsageError

TYPE_CHECKING = False  # typing's own import costs every `gpusched submit`
if TYPE_CHECKING:
    from collections.abc import Sequence

AFTER_OK, AFTER_ANY, AFTER_FAILED = "ok", "any", "failed"
AFTER_CONDITIONS = (AFTER_OK, AFTER_ANY, AFTER_FAILED)


def parse_after(value: str) -> list[tuple[bool, int, str]]:
    """`--after`'s text ("12,13:any,a3") as (is an array id, number, condition) each."""
    parsed: list[tuple[bool, int, str]] = []
    for part in value.split(","):
        target, colon, when = part.strip().partition(":")
        when = when.strip().lower() if colon else AFTER_OK
        if when not in AFTER_CONDITIONS:
            raise UsageError(
                f"--after {part.strip()!r}: expected ID, ID:ok, ID:any or ID:failed"
                " (ok: it succeeded; any: it ended; failed: it did not succeed)"
            )
        is_array = target[:1] in ("a", "A")
        number = target[1:] if is_array else target
        if not (number.isascii() and number.isdigit()) or int(number) < 1:
            raise UsageError(
                f"--after: invalid id {target!r}: expected a job id (12) or an array id (a3)"
            )
        parsed.append((is_array, int(number), when))
    return parsed


def after_text(after: Sequence[int], after_when: Sequence[str] | None) -> str:
    """A job's dependencies as `--after` takes them ("12,13:any"), "-" if none."""
    if not after_when:
        return ",".join(map(str, after)) or "-"
    return ",".join(
        str(dep) if when == AFTER_OK else f"{dep}:{when}"
        for dep, when in zip(after, after_when, strict=False)  # a reply's: shown as it is
    )
