"""A config file's socket read without YAML (config/socket_key.py) is the socket the full
parser reads (config/settings.py `load_config`), or the scanner leaves the file to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.config.paths import SYSTEM_SOCKET_PATH
from gpusched.config.settings import default_config, load_config
from gpusched.config.socket_key import socket_setting
from gpusched.core.errors import GpuschedError

SHIPPED = Path(__file__).resolve().parent.parent / "config" / "gpusched.yaml"
DEFAULT = Path("/nowhere/default.sock")

# Files the scanner reads itself: the parser's socket, or the default where none is named.
PLAIN = [
    "socket: /run/x.sock\n",
    "socket: /run/x.sock   # where clients connect\n",
    "# a comment\nsocket:    /run/with space.sock\r\npoll_interval: 2s\n",
    "limits:\n  users:\n    socket:\n      max_queued: 5\nsocket: /run/y.sock\n",
    "socket: ~/gpusched.sock\n",
    "poll_interval: 2s\n",
    "",
    "   \n# only comments\n",
    "limits:\n  users:\n    socket:\n      max_queued: 5\n",  # a user named socket
]
# Files it leaves to the parser (None): anything YAML might read otherwise.
FANCY = [
    "socket: '/run/quoted.sock'\n",
    'socket: "/run/quoted.sock"\n',
    "socket:\n  /run/next-line.sock\n",
    "socket: /run/a\n  b.sock\n",
    "socket: ~\n",
    "socket:\n",
    "socket: relative.sock\n",
    "socket: 12\n",
    "socket: /run/x.sock\nsocket: /run/y.sock\n",
    "socket: &s /run/x.sock\n",
    "socket: !!str /run/x.sock\n",
    "{socket: /run/x.sock}\n",
    "---\nsocket: /run/x.sock\n",
    "- socket: /run/x.sock\n",
    "\tsocket: /run/x.sock\n",
    "socket: /run/x: y\n",
    "socket:/run/x.sock\n",
    "\ufeffsocket: /run/x.sock\n",
    "socket: |\n  /run/x.sock\n",
    "socket: ~nosuchuser0/x.sock\n",
    "poll_interval: 2s\u2028socket: /run/x.sock\n",  # a line break to YAML
    "socket: /run/x.sock\x00\n",
    "socket: /run/a#b.sock\n",  # a plain path to YAML, but not worth knowing here
]


@pytest.mark.parametrize("text", PLAIN)
def test_a_plain_file_is_read_as_the_parser_reads_it(text: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    found = socket_setting(path, default_config().socket_path)
    assert found is not None
    assert found == load_config(path).socket_path


@pytest.mark.parametrize("text", FANCY)
def test_anything_fancier_is_left_to_the_parser(text: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert socket_setting(path, DEFAULT) is None


def test_the_shipped_config_is_read_without_yaml() -> None:
    assert (
        socket_setting(SHIPPED, DEFAULT) == SYSTEM_SOCKET_PATH == load_config(SHIPPED).socket_path
    )


def test_what_cannot_be_read_is_left_to_the_parser(tmp_path: Path) -> None:
    """A missing file, a directory, bytes that are not UTF-8: the parser's error is said."""
    (tmp_path / "bad.yaml").write_bytes(b"socket: /run/\xff.sock\n")
    for path in (tmp_path / "missing.yaml", tmp_path, tmp_path / "bad.yaml"):
        assert socket_setting(path, DEFAULT) is None
        with pytest.raises(GpuschedError):
            load_config(path)
