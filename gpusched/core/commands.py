"""What a job's command line says of itself: which of its words names the script an
interpreter runs (`python3 train.py`), for submit's check that the script is there and
for the lines of `status` and `history`, which keep that name in view.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:
    from collections.abc import Sequence

# Programs whose first argument, when it is no option, is a script file they read.
INTERPRETERS = ("python", "bash", "sh", "zsh", "perl", "ruby", "node", "Rscript")


def is_interpreter(program: str) -> bool:
    """`python3.12`, `/usr/bin/python3`, `.../python`: named after one of INTERPRETERS."""
    return program.rsplit("/", 1)[-1].rstrip("0123456789.") in INTERPRETERS


def script_index(words: Sequence[str]) -> int | None:
    """The index of the script an interpreter among `words` is given (the word after the
    first interpreter), None when there is none: no interpreter, or an option next."""
    for i, word in enumerate(words[:-1]):
        if is_interpreter(word):
            script = words[i + 1]
            return i + 1 if script and not script.startswith("-") else None
    return None
