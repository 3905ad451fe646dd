"""Notebooks through the queue: a Jupyter kernelspec whose kernel starts through
`gpusched run`, so a notebook takes its GPU from the queue without `import gpusched`.

Jupyter starts the spec's argv: `gpusched run --mem 8G -- PYTHON -m ipykernel_launcher -f
{connection_file}`. `run` queues the kernel, waits until it is placed (saying why on stderr,
which the Jupyter server logs), then starts the user's own Python's ipykernel with
CUDA_VISIBLE_DEVICES set. The GPU is held while the kernel lives and released when it
stops (shut down, restarted, or killed); the idle rules apply as to any `run`.

A kernel still waiting in the queue has not opened its ports yet: Jupyter takes it for dead
after `kernel_info_timeout` (60 s by default in jupyter_server). We do not fail fast: a
place in the queue is worth keeping, so docs/interactive.md says how to raise the timeout,
and `--max-wait` is left to `gpusched run` if one is ever wanted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpusched.core.errors import UsageError
from gpusched.core.units import format_size, parse_size

KERNEL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # what jupyter_client accepts
IPYKERNEL_CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KernelRequest:
    """What `gpusched kernel install` was asked for."""

    mem: str | None
    gpus: int
    name: str | None
    display_name: str | None
    python: str | None
    time_limit: str | None
    socket: str | None


def default_name(mem_bytes: int | None, gpus: int) -> str:
    """`gpusched-8g`, `gpusched-2x16g`, `gpusched-whole-gpu`."""
    size = "whole-gpu" if mem_bytes is None else format_size(mem_bytes).lower().replace(".0", "")
    return f"gpusched-{gpus}x{size}" if gpus > 1 else f"gpusched-{size}"


def kernels_dir(user: bool, prefix: str | None) -> Path:
    """Where jupyter looks, as `jupyter kernelspec install` writes: --prefix DIR is
    DIR/share/jupyter/kernels; --user (the default) is $JUPYTER_DATA_DIR/kernels or
    $XDG_DATA_HOME/jupyter/kernels (~/.local/share/jupyter/kernels)."""
    if prefix is not None:
        if user:
            raise UsageError("--user and --prefix exclude each other")
        return Path(prefix) / "share" / "jupyter" / "kernels"
    data = os.environ.get("JUPYTER_DATA_DIR")
    if data:
        return Path(data) / "kernels"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "jupyter" / "kernels"


def find_python(python: str | None) -> str:
    """The user's own Python (absolute), which must have ipykernel."""
    chosen = python or "python3"
    found = shutil.which(chosen)
    if found is None:
        raise UsageError(f"--python {chosen}: not found on your PATH")
    found = os.path.abspath(found)
    check = subprocess.run(
        [found, "-c", "import ipykernel"],
        capture_output=True,
        timeout=IPYKERNEL_CHECK_TIMEOUT_S,
        check=False,
    )
    if check.returncode != 0:
        raise UsageError(
            f"{found} has no ipykernel: {found} -m pip install ipykernel (or pick another"
            " Python with --python)"
        )
    return found


def gpusched_command() -> list[str]:
    """How the kernel runs `gpusched`: this very command, by absolute path."""
    launched = Path(sys.argv[0])
    if launched.name == "gpusched" and launched.is_file():
        return [str(launched.resolve())]
    found = shutil.which("gpusched")
    if found is not None:
        return [os.path.abspath(found)]
    return [sys.executable, "-m", "gpusched"]


def kernel_argv(request: KernelRequest, python: str, name: str) -> list[str]:
    argv = [*gpusched_command(), "run"]
    if request.socket:
        argv += ["--socket", request.socket]
    if request.mem is not None:
        argv += ["--mem", request.mem]
    argv += ["--gpus", str(request.gpus), "--name", f"kernel {name}"]
    if request.time_limit is not None:
        argv += ["--time", request.time_limit]
    return [*argv, "--", python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def write_kernelspec(request: KernelRequest, directory: Path) -> Path:
    """Write DIR/NAME/kernel.json; return its path."""
    mem_bytes = None if request.mem is None else parse_size(request.mem)
    if request.gpus < 1:
        raise UsageError("--gpus must be at least 1")
    name = request.name or default_name(mem_bytes, request.gpus)
    if not KERNEL_NAME.match(name):
        raise UsageError(
            f"--name {name!r}: a kernel name is letters, digits, '.', '_' and '-' (at most 64)"
        )
    python = find_python(request.python)
    size = "a whole GPU" if mem_bytes is None else f"{format_size(mem_bytes)} of GPU memory"
    gpus = f" x {request.gpus} GPUs" if request.gpus > 1 else ""
    spec = {
        "argv": kernel_argv(request, python, name),
        "display_name": request.display_name or f"Python 3 (gpusched: {size}{gpus})",
        "language": "python",
        # Interrupts reach the kernel as SIGINT to its process group: `gpusched run`
        # ignores it when it has no terminal, ipykernel acts on it.
        "interrupt_mode": "signal",
        "metadata": {"gpusched": {"mem": mem_bytes, "gpus": request.gpus}},
    }
    target = directory / name
    target.mkdir(parents=True, exist_ok=True)
    path = target / "kernel.json"
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def describe(path: Path, argv: Sequence[str]) -> str:
    return f"installed kernel {path.parent.name} in {path.parent}: {shlex.join(argv)}"
