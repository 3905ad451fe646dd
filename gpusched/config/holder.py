"""The one holder of the daemon's current configuration, so a reload reaches every part.

The daemon builds one `ConfigHolder` and hands it to every part that reads settings
while it runs (scheduler, launcher); a SIGHUP reload replaces `current` once, and each
part reads `holder.current` when it needs a value instead of copying the value at
start (a copied `kill_grace` was how a reload once failed to reach the launcher).
Keys that need a restart to change are kept by the daemon before it calls `replace`.
"""

from __future__ import annotations

import threading

from gpusched.config.settings import Config


class ConfigHolder:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._lock = threading.Lock()

    @property
    def current(self) -> Config:
        return self._config  # one attribute read: atomic, no lock needed

    def replace(self, config: Config) -> None:
        with self._lock:
            self._config = config
