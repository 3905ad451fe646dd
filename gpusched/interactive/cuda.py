"""Whether this process has loaded CUDA already: then setting CUDA_VISIBLE_DEVICES is
too late (the driver read it when it initialised), and `claim()` must say so.

Two readings: PyTorch's own answer if it is imported, and, for every framework, whether
the CUDA driver library or NVML is mapped into the process (/proc/self/maps): JAX,
TensorFlow and CuPy load libcuda when they initialise the GPU.
"""

from __future__ import annotations

import contextlib
import sys

# The libraries whose presence means a framework has (or may have) read the variables.
_DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


def cuda_already_loaded(maps_path: str = "/proc/self/maps") -> str | None:
    """What shows CUDA was initialised in this process, or None if nothing does."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    with contextlib.suppress(Exception):  # a broken torch says nothing either way
        if callable(is_initialized) and is_initialized():
            return "torch.cuda.is_initialized() is True"
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1] if line.strip() else ""
                name = path.rsplit("/", 1)[-1]
                if any(name.startswith(lib) for lib in _DRIVER_LIBRARIES):
                    return f"{path} is loaded in this process"
    except OSError:  # not Linux, or no /proc: PyTorch's answer is all there is
        pass
    return None
