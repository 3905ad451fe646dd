"""The `retention:` block's values (gpusched.config.retention): every duration and size
is above zero, and null means "keep forever" / "no cap" wherever it is allowed (not for
`every`, how often the pass runs)."""

from __future__ import annotations

import pytest

from gpusched.config.retention import DAY_S, RetentionSettings, parse_retention
from gpusched.core.errors import UsageError

NULLABLE = [
    ("history", "history_s", "1d", DAY_S, "duration"),
    ("environments", "environments_s", "2h", 7200.0, "duration"),
    ("timelines", "timelines_s", "90s", 90.0, "duration"),
    ("logs", "logs_s", "3d", 3 * DAY_S, "duration"),
    ("user_bytes_per_minute", "user_bytes_per_minute", "1M", 2**20, "size"),
    ("user_bytes_per_day", "user_bytes_per_day", "2G", 2 * 2**30, "size"),
]


@pytest.mark.parametrize(("key", "field", "text", "parsed", "kind"), NULLABLE)
def test_each_key_parses_its_unit_and_null_and_refuses_zero(
    key: str, field: str, text: str, parsed: float, kind: str
) -> None:
    assert getattr(parse_retention({key: text}), field) == parsed
    assert getattr(parse_retention({key: None}), field) is None
    for zero in (0, "0"):
        with pytest.raises(UsageError, match=f"invalid {kind} '0': must be more than zero"):
            parse_retention({key: zero})


def test_every_refuses_null_and_zero_with_the_same_line() -> None:
    assert parse_retention({"every": "5m"}).every_s == 300.0
    with pytest.raises(UsageError) as refused:
        parse_retention({"every": None})
    assert str(refused.value) == "every: expected a duration above zero"
    with pytest.raises(UsageError, match="must be more than zero"):
        parse_retention({"every": "0s"})


def test_keys_left_out_keep_their_defaults() -> None:
    assert parse_retention({"logs": "1d"}) == RetentionSettings(logs_s=DAY_S)
    assert parse_retention({}) == RetentionSettings()
    assert parse_retention(None) == RetentionSettings()
