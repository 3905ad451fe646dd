"""Read and write the fake NVML driver's state file (see fakenvml.c for the format).

The C library re-reads the file on every call under a shared flock; every writer here
takes an exclusive flock on the same file and rewrites it in place, so concurrent writers
(several fake jobs registering at once) never lose an update and the driver never sees
half a file. Stdlib only: tests/fakenvml/gpujob.py imports this module inside fake jobs.

    gpus = make_gpus([24 * GiB, 16 * GiB])
    write_state(path, gpus)                          # the driver now shows two GPUs
    register_process(path, 0, pid, 10 * GiB)         # pid holds 10G on GPU 0 while it lives
    set_gpu(path, 1, lost=True)                      # GPU 1 fell off the bus
    set_driver(path, loaded=False)                   # nvmlInit -> NVML_ERROR_DRIVER_NOT_LOADED
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

GiB = 2**30
MiB = 2**20
# What a real card keeps for the driver and firmware; NVML v2 reports it as `reserved`,
# v1 folds it into `used`. Non-zero by default so the two calls give different answers.
DEFAULT_RESERVED_BYTES = 256 * MiB
DEFAULT_DRIVER_VERSION = "550.54.15"
KINDS = ("compute", "graphics", "both")


@dataclass
class FakeProcess:
    """A process holding memory on one GPU. The driver lists it only while the pid lives."""

    pid: int
    used_bytes: int
    reported: bool = True  # False: NVML says "not available" and the binding gives None
    sm_util: int | None = None  # per-process SM utilization sample, percent
    kind: str = "compute"  # compute, graphics or both
    start_ticks: int | None = None  # /proc/PID/stat starttime: a reused pid is not this process
    # No sample in `sample_missing` of every `sample_every` polls of
    # nvmlDeviceGetProcessUtilization on its GPU: on a real card a job taking turns with
    # others often has none (FIELD.md: 2-3 of 17 polls for a busy job beside another, 13 of
    # 17 for a light one). 6 and 5: a sample in one poll of six; 6 and 1: none in one of six.
    sample_every: int = 1
    sample_missing: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA Fake GPU"
    total_bytes: int = 24 * GiB
    other_bytes: int = 0  # used by something not listed as a process
    reserved_bytes: int = DEFAULT_RESERVED_BYTES
    util_percent: int | None = 0  # None: nvmlDeviceGetUtilizationRates is not supported
    mem_util_percent: int = 0
    lost: bool = False  # every query on this GPU fails with NVML_ERROR_GPU_IS_LOST
    switch: int | None = None  # GPUs with the same number share a PCIe switch; None: unknown
    # The device's own utilization, set apart from its processes' (a busy card shared by two
    # jobs reads 100 % while each process reads its time slice). None: util_percent plus
    # the live processes' sm_util, capped at 100.
    device_util_percent: int | None = None
    # Its /dev/nvidiaN number (nvmlDeviceGetMinorNumber); None: its index, as is usual.
    minor: int | None = None
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeState:
    gpus: list[FakeGpu] = field(default_factory=list)
    driver: bool = True  # False: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
    init_error: int = 0  # any other NVML error code nvmlInit should return
    driver_version: str = DEFAULT_DRIVER_VERSION


def fake_uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{index:012d}"


def make_gpus(sizes: Sequence[int], name: str = "NVIDIA Fake GPU") -> list[FakeGpu]:
    """One idle GPU per size, with stable UUIDs."""
    return [FakeGpu(uuid=fake_uuid(i), name=name, total_bytes=size) for i, size in enumerate(sizes)]


# ---- the file format ----


def _pct(value: int | None) -> str:
    return "na" if value is None else str(int(value))


def dumps(state: FakeState) -> str:
    lines = [
        "# fakenvml state: see tests/fakenvml/fakenvml.c",
        f"driver loaded={int(state.driver)} init_error={state.init_error}"
        f" version={state.driver_version}",
    ]
    procs = []
    for index, gpu in enumerate(state.gpus):
        if not gpu.uuid or any(c.isspace() for c in gpu.uuid) or "\n" in gpu.name:
            raise ValueError(f"fake GPU {index}: uuid without spaces and a one-line name needed")
        lines.append(
            f"gpu uuid={gpu.uuid} total={gpu.total_bytes} other={gpu.other_bytes}"
            f" reserved={gpu.reserved_bytes} util={_pct(gpu.util_percent)}"
            f" memutil={gpu.mem_util_percent} lost={int(gpu.lost)}"
            + ("" if gpu.switch is None else f" switch={gpu.switch}")
            + ("" if gpu.device_util_percent is None else f" devutil={gpu.device_util_percent}")
            + ("" if gpu.minor is None else f" minor={gpu.minor}")
            + f" name={gpu.name}"
        )
        for p in gpu.processes:
            if p.kind not in KINDS:
                raise ValueError(f"process kind must be one of {KINDS}, not {p.kind!r}")
            start = "" if p.start_ticks is None else f" start={p.start_ticks}"
            procs.append(
                f"proc gpu={index} pid={p.pid} used={p.used_bytes} reported={int(p.reported)}"
                f" sm={_pct(p.sm_util)} kind={p.kind}{start}"
                f" every={p.sample_every} miss={p.sample_missing}"
            )
    return "\n".join([*lines, *procs]) + "\n"


def loads(text: str) -> FakeState:
    state = FakeState()
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word not in ("driver", "gpu", "proc"):
            continue
        head, _, name = rest.partition(" name=") if word == "gpu" else (rest, "", "")
        values = dict(tok.split("=", 1) for tok in head.split() if "=" in tok)
        if word == "driver":
            state.driver = values.get("loaded", "1") != "0"
            state.init_error = int(values.get("init_error", "0"))
            state.driver_version = values.get("version", DEFAULT_DRIVER_VERSION)
        elif word == "gpu":
            state.gpus.append(
                FakeGpu(
                    uuid=values["uuid"],
                    name=name,
                    total_bytes=int(values["total"]),
                    other_bytes=int(values.get("other", "0")),
                    reserved_bytes=int(values.get("reserved", "0")),
                    util_percent=None if values.get("util") == "na" else int(values["util"]),
                    mem_util_percent=int(values.get("memutil", "0")),
                    lost=values.get("lost") == "1",
                    switch=int(values["switch"]) if "switch" in values else None,
                    device_util_percent=int(values["devutil"]) if "devutil" in values else None,
                    minor=int(values["minor"]) if "minor" in values else None,
                )
            )
        else:
            state.gpus[int(values["gpu"])].processes.append(
                FakeProcess(
                    pid=int(values["pid"]),
                    used_bytes=int(values["used"]),
                    reported=values.get("reported", "1") != "0",
                    sm_util=None if values.get("sm", "na") == "na" else int(values["sm"]),
                    kind=values.get("kind", "compute"),
                    start_ticks=int(values["start"]) if "start" in values else None,
                    sample_every=int(values.get("every", "1")),
                    sample_missing=int(values.get("miss", "0")),
                )
            )
    return state


# ---- locked access ----


@contextmanager
def _locked(path: str | os.PathLike[str], exclusive: bool) -> Iterator[int]:
    fd = os.open(path, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _read_fd(fd: int) -> str:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 65536, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode()


def _write_fd(fd: int, state: FakeState) -> None:
    data = dumps(state).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def read_state(path: str | os.PathLike[str]) -> FakeState:
    with _locked(path, exclusive=False) as fd:
        return loads(_read_fd(fd))


@contextmanager
def update_state(path: str | os.PathLike[str]) -> Iterator[FakeState]:
    """Read-modify-write under the exclusive lock; dead processes are dropped on the way."""
    with _locked(path, exclusive=True) as fd:
        state = loads(_read_fd(fd))
        yield state
        for gpu in state.gpus:
            gpu.processes = [p for p in gpu.processes if pid_alive(p.pid, p.start_ticks)]
        _write_fd(fd, state)


def write_state(
    path: str | os.PathLike[str],
    gpus: Sequence[FakeGpu],
    *,
    driver: bool = True,
    init_error: int = 0,
    driver_version: str = DEFAULT_DRIVER_VERSION,
) -> None:
    """Replace the whole state: these GPUs, this driver."""
    with update_state(path) as state:
        state.gpus = [dataclasses.replace(g, processes=list(g.processes)) for g in gpus]
        state.driver = driver
        state.init_error = init_error
        state.driver_version = driver_version


def set_driver(path: str | os.PathLike[str], *, loaded: bool = True, init_error: int = 0) -> None:
    with update_state(path) as state:
        state.driver = loaded
        state.init_error = init_error


def find_gpu(state: FakeState, gpu: int | str) -> int:
    """Index of a GPU given as an NVML index, a UUID, or a unique UUID prefix (as CUDA allows)."""
    if isinstance(gpu, int) or gpu.isdigit():
        index = int(gpu)
        if 0 <= index < len(state.gpus):
            return index
    else:
        matches = [i for i, g in enumerate(state.gpus) if g.uuid.startswith(gpu)]
        if len(matches) == 1:
            return matches[0]
    raise LookupError(f"no fake GPU {gpu!r} among {[g.uuid for g in state.gpus]}")


def set_gpu(path: str | os.PathLike[str], gpu: int | str, **changes: object) -> None:
    """Change fields of one FakeGpu, e.g. set_gpu(p, 0, lost=True, other_bytes=2 * GiB)."""
    with update_state(path) as state:
        index = find_gpu(state, gpu)
        state.gpus[index] = dataclasses.replace(state.gpus[index], **changes)  # type: ignore[arg-type]


def register_process(
    path: str | os.PathLike[str],
    gpu: int | str,
    pid: int,
    used_bytes: int,
    *,
    reported: bool = True,
    sm_util: int | None = None,
    kind: str = "compute",
    sample_every: int = 1,
    sample_missing: int = 0,
) -> None:
    """pid now holds used_bytes on this GPU (replacing what it held there before)."""
    start = proc_start_ticks(pid)
    with update_state(path) as state:
        target = state.gpus[find_gpu(state, gpu)]
        target.processes = [p for p in target.processes if p.pid != pid]
        target.processes.append(
            FakeProcess(
                pid, used_bytes, reported, sm_util, kind, start, sample_every, sample_missing
            )
        )


def unregister_process(
    path: str | os.PathLike[str], pid: int, gpu: int | str | None = None
) -> None:
    """pid frees its memory on this GPU (or on every GPU) without exiting."""
    with update_state(path) as state:
        indices = range(len(state.gpus)) if gpu is None else [find_gpu(state, gpu)]
        for i in indices:
            state.gpus[i].processes = [p for p in state.gpus[i].processes if p.pid != pid]


# ---- liveness, judged exactly as fakenvml.c judges it ----


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()  # [0] is field 3 (state)


def proc_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or (len(fields) > 19 and int(fields[19]) == start_ticks)
