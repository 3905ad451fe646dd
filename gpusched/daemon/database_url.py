"""The `database:` URL's secret: a password in it must be readable by root only.

The daemon of a shared queue reaches PostgreSQL with a role whose password may be written
in the URL (`postgresql+psycopg://gpusched:SECRET@dbhost/gpusched`). Then the config file
is a credential: a daemon whose config file is readable by anyone but its owner refuses
to start, saying so in one line, rather than serve a queue whose password every user can
read. (Without a password in the URL, libpq reads root's ~/.pgpass, which it ignores
unless it is private: docs/cluster.md.) Parsed with urllib: the client side never imports
SQLAlchemy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from gpusched.core.errors import ConfigError


def has_password(url: str) -> bool:
    """Whether the URL carries a password (in its authority or as ?password=)."""
    parts = urlsplit(url)
    return bool(parts.password) or "password" in parse_qs(parts.query)


def check_password_private(url: str, config_file: Path | None) -> None:
    """Raise ConfigError if `url` holds a password and `config_file` is readable by others."""
    if config_file is None or not has_password(url):
        return
    try:
        mode = stat.S_IMODE(os.stat(config_file).st_mode)
    except OSError:
        return  # it was read a moment ago; a file gone since is the loader's concern
    if mode & 0o077:
        raise ConfigError(
            f"{config_file}: 'database' holds a password but the file is readable by others"
            f" (mode {mode:o}): chmod 600 {config_file}, or keep the password in root's"
            " ~/.pgpass"
        )
