"""The `interactive:` config block: its keys, its defaults, and one-line errors naming them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpusched.config.interactive import InteractiveSettings
from gpusched.config.settings import load_config
from gpusched.core.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "gpusched.yaml"


def test_every_interactive_key_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "interactive: {default_time: 8h, max_time: 1d, max_per_user: 2,"
        " idle_timeout: 30m, on_idle: end}\n"
    )
    assert load_config(path).interactive == InteractiveSettings(
        default_time_s=8 * 3600.0,
        max_time_s=86400.0,
        max_per_user=2,
        idle_timeout_s=1800.0,
        on_idle="end",
    )


def test_the_shipped_config_documents_the_block_with_its_defaults() -> None:
    documented = yaml.safe_load(SHIPPED.read_text())["interactive"]
    assert set(documented) == {
        "default_time",
        "max_time",
        "max_per_user",
        "idle_timeout",
        "on_idle",
    }
    assert load_config(SHIPPED).interactive == InteractiveSettings()
    assert load_config(None).interactive == InteractiveSettings()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("[1]", "expected a mapping"),
        ("{max_per_user: -1}", "max_per_user"),
        ("{max_per_user: yes}", "max_per_user"),
        ("{idle_timeout: soon}", "invalid duration"),
        ("{on_idle: kill}", "on_idle"),
        ("{on_idle: end}", "needs an idle_timeout"),
        ("{default_time: 2h, max_time: 1h}", "longer than max_time"),
        ("{max_users: 2}", "unknown key 'max_users'"),
    ],
)
def test_a_bad_value_names_the_file_and_the_key(tmp_path: Path, value: str, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"interactive: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in info.value.message
    assert "'interactive'" in info.value.message
    assert problem in info.value.message
