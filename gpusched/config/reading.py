"""Reading a config file: its bytes off the disk, decoded and parsed into the mapping of
keys settings.py checks, every way a file can be wrong refused with one line.

The file is read whole only when it is a regular file of at most MAX_CONFIG_BYTES (a
config named /dev/zero or a FIFO would otherwise hang or fill memory), decoded as UTF-8
whatever the locale says (the same file must mean the same under every locale), and parsed by
YAML's safe loader.

Imported only when a file is read: a client finding its socket without one pays for no YAML.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from gpusched.core.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # config/gpusched.yaml, every key explained, is under 20K


def _read_bytes(path: Path) -> bytes:
    """The whole file, if it is a regular file of at most MAX_CONFIG_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the name: no such file can exist
        raise ConfigError(f"{path!r}: config file not found") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: cannot read config file: not a regular file")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config file")
    return data


def read_config_file(path: Path) -> dict[Any, Any]:
    """The mapping a config file holds ({} for an empty one), or ConfigError naming the
    file and, where there is one, the line or byte."""
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not valid UTF-8 at byte {exc.start} (line {line}): save it as UTF-8"
        ) from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return loaded
