"""A config file's bytes off the disk: the whole file, only when it is a regular file of
at most MAX_CONFIG_BYTES (a config named /dev/zero or a FIFO would otherwise hang or fill
memory), every way it cannot be read refused with one line naming it.

Apart from the YAML reader (config/reading.py) so that a client reading only the socket
key (config/socket_key.py) reads the file the same way without importing YAML.
"""

from __future__ import annotations

import os
import stat

from gpusched.core.errors import ConfigError

TYPE_CHECKING = False  # typing's own import costs every client command
if TYPE_CHECKING:
    from pathlib import Path

MAX_CONFIG_BYTES = 1 << 20  # config/gpusched.yaml, every key explained, is under 20K


def read_config_bytes(path: Path) -> bytes:
    """The whole file, if it is a regular file of at most MAX_CONFIG_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the name: no such file can exist
        raise ConfigError(f"{str(path)!r}: config file not found") from None
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
