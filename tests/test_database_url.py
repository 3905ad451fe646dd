"""The `database:` URL's password: found wherever the URL carries it, never shown, and
refused in a config file that others can read (gpusched.daemon.database_url, store.engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.errors import ConfigError
from gpusched.daemon.database_url import check_password_private, has_password
from gpusched.store.engine import describe_url

WITH_PASSWORD = [
    "postgresql+psycopg://gpusched:s3cret@dbhost/gpusched",
    "postgresql+psycopg://gpusched:s3cret@dbhost:5433/gpusched?sslmode=verify-full",
    "postgresql+psycopg://gpusched@dbhost/gpusched?password=s3cret",
]
WITHOUT = [
    "sqlite:////var/lib/gpusched/gpusched.db",
    "postgresql+psycopg://gpusched@dbhost/gpusched?sslmode=verify-full",
    "postgresql+psycopg://gpusched@/gpusched?host=/run/postgresql",
]


@pytest.mark.parametrize("url", WITH_PASSWORD)
def test_a_password_is_found_and_never_shown(url: str) -> None:
    assert has_password(url)
    shown = describe_url(url)
    assert "s3cret" not in shown
    assert "gpusched@dbhost" in shown


@pytest.mark.parametrize("url", WITHOUT)
def test_no_password(url: str) -> None:
    assert not has_password(url)
    assert describe_url(url) == url


def test_a_socket_directory_is_shown_as_a_path() -> None:
    url = "postgresql+psycopg://u:pw@/db?host=/run/postgresql&port=5433"
    assert describe_url(url) == "postgresql+psycopg://u@/db?host=/run/postgresql&port=5433"


@pytest.mark.parametrize(
    ("mode", "refused"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True)]
)
def test_a_config_file_holding_a_password_must_be_private(
    tmp_path: Path, mode: int, refused: bool
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"database: {WITH_PASSWORD[0]}\n")
    config.chmod(mode)
    if not refused:
        check_password_private(WITH_PASSWORD[0], config)
        return
    with pytest.raises(ConfigError) as error:
        check_password_private(WITH_PASSWORD[0], config)
    assert f"(mode {mode:o}): chmod 600 {config}" in error.value.message
    assert "s3cret" not in error.value.message


def test_without_a_password_any_mode_will_do(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"database: {WITHOUT[1]}\n")
    config.chmod(0o644)
    check_password_private(WITHOUT[1], config)
    check_password_private(WITH_PASSWORD[0], None)  # defaults: no file, nothing to check
