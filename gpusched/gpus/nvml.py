"""The NVML probe: the GPUs as the NVIDIA driver reports them, through nvidia-ml-py.

This module owns every call into NVML (the `pynvml` module of nvidia-ml-py) and the rules
for when it fails (STYLE.md #5):

- NVML is initialised lazily, on the first `snapshot()`. If that fails (no library, no
  driver, no permission...) the probe raises `GpuError` with one line naming the cause and
  the fix; nothing else in gpusched ever sees an NVMLError.
- After that, a GPU that stops answering is reported with `health=lost` and the error,
  keeping the identity it last had (uuid, name, total); it is read again on every snapshot,
  so a GPU that recovers comes back `ok`. The daemon's loop never crashes on a GPU.
- Old drivers lack newer entry points (memory v2 before R510, process lists v3): the probe
  falls back to the older call once and remembers it.

Memory follows NVML v2: `used_bytes` excludes the few hundred MiB the driver reserves for
itself, so `used_bytes + free_bytes <= total_bytes`. On a v1-only driver the reserve is part
of `used_bytes` and the sum is equal. Schedule on `free_bytes`, which is the same for both.

Importing this module imports pynvml; `gpusched.gpus.probe` does not, so the CLI stays light.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pynvml  # type: ignore[import-untyped]

from gpusched.core.errors import GpuError
from gpusched.core.models import GpuHealth, GpuProcess, GpuState

_WITHOUT_GPUS = "or try the scheduler without GPUs: gpusched daemon --simulate 2x24G"

# NVML init error -> (what went wrong, what to do about it), for the one-line GpuError.
_INIT_CAUSES: dict[int, tuple[str, str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "NVIDIA driver library libnvidia-ml.so.1 not found",
        "Install the NVIDIA driver",
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded",
        "Check that `nvidia-smi` works (load the driver, or reboot after installing it)",
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to open the GPUs",
        "Check the permissions of /dev/nvidia*",
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVIDIA library and kernel driver versions differ",
        "Reboot to finish the driver upgrade",
    ),
}

_Lister = Callable[[Any], list[Any]]


def init_error_message(exc: pynvml.NVMLError) -> str:
    what, fix = _INIT_CAUSES.get(
        exc.value, ("NVML failed to initialise", "Check that `nvidia-smi` works")
    )
    return f"cannot read GPUs: {what} (NVML: {exc}). {fix}, {_WITHOUT_GPUS}"


class NvmlProbe:
    """Reads every GPU NVML lists. Thread-safe; `close()` shuts NVML down until next use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialized = False
        self._memory_v2: bool | None = None  # None: not tried yet on this driver
        # Newest call first; a version the driver lacks is dropped the first time it fails.
        self._process_calls: list[list[_Lister]] = [
            [
                pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
                pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
            ],
            [
                pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2,
            ],
        ]
        self._known: dict[int, GpuState] = {}  # last good reading per NVML index
        self._util_seen_us: dict[str, int] = {}  # per uuid: newest process sample seen
        self._topology: dict[str, dict[str, int]] | None = None  # read once (topology())
        self._minors: dict[str, int] = {}  # per uuid: read once (device_minors())

    # ---- the Probe protocol ----

    def snapshot(self) -> list[GpuState]:
        with self._lock:
            self._ensure_init()
            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                if not self._known:
                    raise GpuError(
                        f"cannot read GPUs: NVML cannot count them (NVML: {exc}). "
                        f"Check that `nvidia-smi` works, {_WITHOUT_GPUS}"
                    ) from exc
                # The driver answered before: keep showing its GPUs, as unusable.
                return [self._lost(i, f"NVML device count: {exc}") for i in sorted(self._known)]
            states = [self._read(index) for index in range(count)]
            # A GPU that drops out of the count still holds our jobs' claims: show it as lost.
            states += [
                self._lost(i, "no longer listed by NVML") for i in sorted(self._known) if i >= count
            ]
            return states

    def note_job_started(
        self,
        pid: int,
        gpu_uuids: Sequence[str],
        mem_bytes: int | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Nothing to do: the driver itself sees the job's processes."""

    def describe(self) -> str:
        with self._lock:
            try:
                self._ensure_init()
                driver = pynvml.nvmlSystemGetDriverVersion()
                count = pynvml.nvmlDeviceGetCount()
            except (GpuError, pynvml.NVMLError) as exc:
                return f"NVML GPUs, unavailable: {exc}"
            return f"NVML GPUs: {count} GPU(s), NVIDIA driver {driver}"

    def close(self) -> None:
        with self._lock:
            if self._initialized:
                self._initialized = False
                # Shutting down a driver that went away: nothing is left to release.
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()

    # ---- extras ----

    def topology(self) -> dict[str, dict[str, int]]:
        """How close each pair of GPUs is: NVML's common-ancestor level (0 the same board,
        10 one PCIe switch ... 50 across CPU sockets), by uuid. Read once (it does not
        change while the driver is loaded); pairs the driver cannot tell are left out."""
        with self._lock:
            if self._topology is not None:
                return self._topology
            levels: dict[str, dict[str, int]] = {}
            try:
                self._ensure_init()
                handles = []
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    handles.append((str(pynvml.nvmlDeviceGetUUID(handle)), handle))
            except (GpuError, pynvml.NVMLError):
                return {}  # read again next time: the driver may come back
            for uuid, handle in handles:
                for other_uuid, other in handles:
                    if other_uuid == uuid:
                        continue
                    try:
                        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, other)
                    except pynvml.NVMLError:
                        continue
                    levels.setdefault(uuid, {})[other_uuid] = int(level)
            self._topology = levels
            return levels

    def device_minors(self) -> dict[str, int]:
        """Each card's /dev/nvidiaN number by uuid: NVML's minor number, which need not be
        its index (the driver numbers cards in PCI order). A job's cgroup denies those of
        the cards it was not given (gpusched.processes.devices). Read once per card of the
        last snapshot, as it is fixed while the driver is loaded; a card NVML could never
        answer for is left out."""
        with self._lock:
            for gpu in self._known.values():
                if gpu.uuid in self._minors:
                    continue
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                    self._minors[gpu.uuid] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
                except pynvml.NVMLError:
                    continue  # asked again at the next job's start
            return dict(self._minors)

    def process_utilization(self) -> dict[str, dict[int, int]]:
        """SM utilization (percent) per pid sampled since the last call, by GPU uuid.

        Only GPUs that were ok at the last snapshot are asked. A GPU with no new sample
        (NVML answers NOT_FOUND) maps to {}; one whose driver cannot sample is left out.
        """
        with self._lock:
            self._ensure_init()
            result: dict[str, dict[int, int]] = {}
            for gpu in self._known.values():
                if gpu.health is not GpuHealth.OK:
                    continue
                since = self._util_seen_us.get(gpu.uuid, 0)
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
                except pynvml.NVMLError_NotFound:
                    samples = []  # nothing ran on it since the last call
                except pynvml.NVMLError:
                    continue  # cannot sample, or failing: the next snapshot reports that
                latest: dict[int, int] = {}
                for sample in sorted(samples, key=lambda s: s.timeStamp):
                    latest[sample.pid] = int(sample.smUtil)
                    since = max(since, int(sample.timeStamp))
                self._util_seen_us[gpu.uuid] = since
                result[gpu.uuid] = latest
            return result

    # ---- internals (called with the lock held) ----

    def _ensure_init(self) -> None:
        if self._initialized:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            # Not cached: the next call tries again, so a driver loaded later is picked up.
            raise GpuError(init_error_message(exc)) from exc
        self._initialized = True

    def _read(self, index: int) -> GpuState:
        step = "device handle"
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            step = "UUID"
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            known = self._known.get(index)
            step = "name"
            name = known.name if known and known.uuid == uuid else pynvml.nvmlDeviceGetName(handle)
            step = "memory info"
            total, used, free = self._memory(handle)
            step = "running processes"
            processes = self._processes(handle)
            step = "utilization"
            util = self._utilization(handle)
        except pynvml.NVMLError as exc:
            return self._lost(index, f"NVML {step}: {exc}")
        state = GpuState(
            index=index,
            uuid=uuid,
            name=name,
            total_bytes=total,
            used_bytes=used,
            free_bytes=free,
            util_percent=util,
            processes=processes,
        )
        self._known[index] = state
        return state

    def _lost(self, index: int, error: str) -> GpuState:
        known = self._known.get(index)
        if known is None:  # lost before we ever read it: no identity to keep
            known = GpuState(index, f"GPU-unknown-index-{index}", "unknown GPU", 0, 0, 0)
        return replace(
            known,
            used_bytes=0,
            free_bytes=0,
            util_percent=None,
            health=GpuHealth.LOST,
            processes=(),
            error=error,
        )

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        if self._memory_v2 is not False:
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_ArgumentVersionMismatch):
                self._memory_v2 = False  # a driver before R510: use v1 from now on
            else:
                self._memory_v2 = True
                return int(info.total), int(info.used), int(info.free)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), int(info.free)

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        # A process may be both a compute and a graphics client; NVML then lists it twice
        # with the same memory. Merge by pid, keeping a known amount over an unknown one.
        used_by_pid: dict[int, int | None] = {}
        for calls in self._process_calls:
            for info in self._list_processes(calls, handle):
                pid, used = int(info.pid), info.usedGpuMemory
                previous = used_by_pid.get(pid)
                if pid not in used_by_pid or previous is None:
                    used_by_pid[pid] = None if used is None else int(used)
                elif used is not None:
                    used_by_pid[pid] = max(previous, int(used))
        return tuple(GpuProcess(pid, used) for pid, used in used_by_pid.items())

    @staticmethod
    def _list_processes(calls: list[_Lister], handle: Any) -> list[Any]:
        while calls:
            try:
                return calls[0](handle)
            except pynvml.NVMLError_FunctionNotFound:
                calls.pop(0)  # older driver: fall back to the previous version for good
            except pynvml.NVMLError_NotSupported:
                return []  # e.g. graphics clients on a compute-only board
        return []

    @staticmethod
    def _utilization(handle: Any) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return None
