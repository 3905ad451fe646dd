"""gpusched: a GPU job scheduler for shared Linux servers.

This package root stays import-light on purpose: the CLI, the Python API and the
job supervisor all import it, and none of them may pull in SQLAlchemy,
APScheduler or pynvml.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import costs every client command its start-up

__all__ = [
    "Claim",
    "ClaimInsideJob",
    "Client",
    "CudaAlreadyInitialised",
    "GpuschedError",
    "NotPlaced",
    "__version__",
    "claim",
]

if TYPE_CHECKING:
    from typing import Any

    from gpusched.client import Client
    from gpusched.core.errors import GpuschedError
    from gpusched.core.requests.protocol import VERSION as __version__
    from gpusched.interactive.claim import (
        Claim,
        ClaimInsideJob,
        CudaAlreadyInitialised,
        NotPlaced,
        claim,
    )


def __getattr__(name: str) -> Any:
    # Lazy so that `import gpusched.processes.supervisor` does not drag the client in.
    if name == "__version__":  # the protocol's, which the client sends with each request
        from gpusched.core.requests.protocol import VERSION

        return VERSION
    if name == "Client":
        from gpusched.client import Client

        return Client
    if name == "GpuschedError":  # the root of every error the client raises
        from gpusched.core.errors import GpuschedError

        return GpuschedError
    # A GPU for this process (a notebook): see gpusched.interactive.claim.
    if name in ("claim", "Claim", "ClaimInsideJob", "CudaAlreadyInitialised", "NotPlaced"):
        import gpusched.interactive.claim as module

        return getattr(module, name)
    raise AttributeError(name)
