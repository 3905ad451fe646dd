"""A client and a daemon of different versions (issue 28, item 4): compatible when they
share major.minor, refused otherwise with a message that names both versions and the fix;
`ping` always answers (it is how a client learns the daemon's version)."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched import __version__
from gpusched.core.errors import ProtocolError
from gpusched.core.requests.protocol import compatible_versions


def other_minor(version: str) -> str:
    major, minor, *_ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def test_the_rule() -> None:
    assert compatible_versions("0.1.0", "0.1.7")
    assert compatible_versions("1.2.3", "1.2.0")
    assert not compatible_versions("0.1.0", "0.2.0")
    assert not compatible_versions("1.1.0", "2.1.0")


def test_a_client_of_another_minor_version_is_refused_by_the_daemon(daemon: Any) -> None:
    client = daemon.client()
    newer = other_minor(__version__)
    with pytest.raises(ProtocolError) as refused:
        client.request("status", client_version=newer)
    assert f"client is version {newer} but the daemon is {__version__}" in refused.value.message
    assert "pip install" in refused.value.message
    # The fix names the server's wheel: by name, PyPI's gpusched is another project.
    assert "share/wheels/gpusched-*.whl" in refused.value.message
    assert "pip install 'gpusched" not in refused.value.message
    patch = ".".join([*__version__.split(".")[:2], "99"])
    assert client.request("status", client_version=patch)["gpus"]  # same minor: served
    assert client.request("ping", client_version=newer)["version"] == __version__


def test_check_version_accepts_its_own_daemon(daemon: Any) -> None:
    assert daemon.client().check_version()["version"] == __version__
