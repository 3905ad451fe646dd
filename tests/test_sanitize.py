"""The one sanitizer for people's eyes (gpusched.core.sanitize) and the daemon log's formatter."""

from __future__ import annotations

import logging
import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.models import Job, JobState
from gpusched.core.sanitize import command_for_log, quoted, shown, shown_fields, shown_output
from gpusched.daemon.logfmt import CONTINUATION, OneLineFormatter

INTERPRETED = {"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"}


def _unescape(text: str) -> str:
    """The inverse of shown() for text that held no backslash."""
    return text.encode("ascii", "backslashreplace").decode("unicode_escape")


def test_control_and_format_characters_are_shown_escaped() -> None:
    assert shown("a\x1b[31mred") == "a\\x1b[31mred"
    assert shown("one\ntwo\rthree\tfour") == "one\\ntwo\\rthree\\tfour"
    assert shown("\x00\x07\x7f\x9b2J") == "\\x00\\x07\\x7f\\x9b2J"  # NUL, BEL, DEL, 8-bit CSI
    # Bidi overrides and isolates, a zero-width joiner, line/paragraph separators, a BOM.
    assert shown("x\u202ey\u2066z\u200d\u2028\u2029\ufeff") == (
        "x\\u202ey\\u2066z\\u200d\\u2028\\u2029\\ufeff"
    )
    assert shown("tag\U000e0041") == "tag\\U000e0041"
    assert shown("bad\udcffbyte") == "bad\\udcffbyte"  # an undecodable byte of an argv


def test_printable_text_of_every_script_is_unchanged() -> None:
    for text in ("python train.py --lr 0.1", "résumé 日本語 Ελληνικά 👍", "C:\\path", "a\u00a0b"):
        assert shown(text) == text
    assert shown(12) == "12"


@given(st.text())
def test_nothing_a_terminal_interprets_survives(text: str) -> None:
    out = shown(text)
    assert not [c for c in out if unicodedata.category(c) in INTERPRETED]
    assert "\n" not in out and "\r" not in out  # one line, whatever it held


@given(st.text().filter(lambda t: "\\" not in t))
def test_text_without_backslashes_reads_back_exactly(text: str) -> None:
    # One to one: two different names never look the same once shown.
    assert _unescape(shown(text)) == text


@given(st.text())
def test_shown_is_idempotent(text: str) -> None:
    assert shown(shown(text)) == shown(text)


@given(st.text())
def test_output_keeps_its_lines_and_tabs_and_nothing_else(text: str) -> None:
    out = shown_output(text)
    assert out.count("\n") == text.count("\n")
    assert out.count("\t") == text.count("\t")
    assert not [c for c in out if unicodedata.category(c) in INTERPRETED and c not in "\n\t"]


def test_quoted_is_cut_and_delimited() -> None:
    assert quoted("a\nb") == '"a\\nb"'
    assert quoted("x" * 50, limit=10) == '"xxxxxxx..."'


def test_the_log_names_a_program_not_a_command_line_unless_allowed() -> None:
    argv = ["/home/alice/bin/train\n2026 forged", "--token", "s3cret"]
    assert command_for_log(argv, show_commands=False) == 'program "train\\n2026 forged"'
    on = command_for_log(argv, show_commands=True)
    assert "s3cret" in on
    assert "\n" not in on
    assert command_for_log([], show_commands=False) == 'program ""'


def test_every_text_field_of_a_job_is_shown_escaped() -> None:
    job = Job(
        id=1,
        user="mallory",
        uid=1000,
        command=["echo", "\x1b]0;title\x07"],
        cwd="/tmp/\n",
        state=JobState.FAILED,
        name="\u202egnp.exe",
        hints=["a\rb"],
        notify=["mail", "\x1b[2J"],
    )
    clean = shown_fields(job)
    assert clean.command == ["echo", "\\x1b]0;title\\x07"]
    assert clean.cwd == "/tmp/\\n"
    assert clean.name == "\\u202egnp.exe"
    assert clean.hints == ["a\\rb"]
    assert clean.notify == ["mail", "\\x1b[2J"]
    assert clean.state is JobState.FAILED
    assert job.name == "\u202egnp.exe"  # a copy: the original is left as it was
    assert shown_fields(clean) is clean  # nothing left to change


def test_the_daemon_log_writes_one_line_per_record() -> None:
    formatter = OneLineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "gpusched.x", logging.INFO, __file__, 1, "job %s: %s", (3, "a\nINFO forged\x1b[2J"), None
    )
    assert formatter.format(record) == "INFO job 3: a\\nINFO forged\\x1b[2J"
    try:
        raise ValueError("bad\nINFO forged line")
    except ValueError:
        failed = logging.LogRecord(
            "gpusched.x", logging.ERROR, __file__, 1, "request failed", (), sys.exc_info()
        )
    lines = formatter.format(failed).splitlines()
    assert lines[0] == "ERROR request failed"
    assert lines[1:] and all(line.startswith(CONTINUATION) for line in lines[1:])
    assert not any(line.startswith("INFO") for line in lines)
