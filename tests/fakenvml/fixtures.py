"""pytest fixtures for the fake NVML driver; tests/conftest.py imports them.

    fake_nvml           the full fake driver (as a current R550 driver)
    fake_nvml_no_v2     built without nvmlDeviceGetMemoryInfo_v2 (a driver before R510)
    fake_nvml_old       also without the _v3 process lists
    fake_nvml_inproc    fake_nvml, loaded into this test process so pynvml finds it

Each gives a FakeNvml with its own state file, starting with two idle 24 GiB GPUs. The
library is compiled once per session and variant; no gcc means the tests are skipped.

In-process use: pynvml dlopens "libnvidia-ml.so.1" by name and caches the handle for the
life of the process, and the loader reads LD_LIBRARY_PATH only at start-up. So only one
build can live in a test process: fake_nvml_inproc preloads the full build (a later dlopen
by soname returns it). The library reads FAKENVML_STATE on every call, so each test still
gets its own GPUs. Anything else (other builds, no library at all, the daemon) runs in a
subprocess with `fake.env()`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakenvml import state as fakestate

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
GPUJOB = HERE / "gpujob.py"
REPO_ROOT = HERE.parents[1]
SONAME = "libnvidia-ml.so.1"

VARIANTS: dict[str, tuple[str, ...]] = {
    "full": (),
    "no_memory_v2": ("FAKENVML_NO_MEMORY_V2",),
    "old": ("FAKENVML_NO_MEMORY_V2", "FAKENVML_NO_PROCESS_V3"),
}


def build_fake_nvml(out_dir: Path, defines: Sequence[str] = ()) -> Path:
    """Compile fakenvml.c into out_dir/libnvidia-ml.so.1; returns out_dir."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (gcc): cannot build the fake NVML driver tests/fakenvml")
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [compiler, "-shared", "-fPIC", "-O1", "-Wall", *(f"-D{d}" for d in defines)]
    argv += [f"-Wl,-soname,{SONAME}", "-o", str(out_dir / SONAME), str(SOURCE)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake NVML driver failed:\n{done.stderr}")
    return out_dir


@dataclass
class FakeNvml:
    """One fake driver build plus one state file."""

    lib_dir: Path
    state_path: Path

    @property
    def lib_path(self) -> Path:
        return self.lib_dir / SONAME

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess that should see these fake GPUs."""
        env = dict(os.environ if base is None else base)
        previous = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{self.lib_dir}:{previous}" if previous else str(self.lib_dir)
        env["FAKENVML_STATE"] = str(self.state_path)
        # So that `python -c "import gpusched"` and gpujob.py work from any cwd.
        previous = env.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{REPO_ROOT}:{previous}" if previous else str(REPO_ROOT)
        return env

    # ---- the GPUs ----

    def set_gpus(
        self, gpus: Sequence[int | fakestate.FakeGpu], *, driver: bool = True
    ) -> list[fakestate.FakeGpu]:
        """Replace the GPUs: FakeGpu objects, or sizes in bytes for idle ones."""
        objs = [
            g
            if isinstance(g, fakestate.FakeGpu)
            else fakestate.FakeGpu(uuid=fakestate.fake_uuid(i), total_bytes=g)
            for i, g in enumerate(gpus)
        ]
        fakestate.write_state(self.state_path, objs, driver=driver)
        return objs

    def set_gpu(self, gpu: int | str, **changes: object) -> None:
        fakestate.set_gpu(self.state_path, gpu, **changes)

    def set_driver(self, *, loaded: bool = True, init_error: int = 0) -> None:
        fakestate.set_driver(self.state_path, loaded=loaded, init_error=init_error)

    def register_process(self, gpu: int | str, pid: int, used_bytes: int, **kw: object) -> None:
        fakestate.register_process(self.state_path, gpu, pid, used_bytes, **kw)  # type: ignore[arg-type]

    def unregister_process(self, pid: int, gpu: int | str | None = None) -> None:
        fakestate.unregister_process(self.state_path, pid, gpu)

    def read(self) -> fakestate.FakeState:
        return fakestate.read_state(self.state_path)

    # ---- subprocesses ----

    def gpujob_argv(self, *args: str) -> list[str]:
        """argv of the fake GPU job, e.g. fake.gpujob_argv("--mem", "10G", "--hold", "5")."""
        return [sys.executable, str(GPUJOB), *args]

    def run_python(self, code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run `python -c code` against this fake driver."""
        return subprocess.run(
            [sys.executable, "-c", code],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


class FakeNvmlBuilds:
    """Lazily compiled variants of the fake driver, one directory each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[str, Path] = {}

    def lib_dir(self, variant: str = "full") -> Path:
        if variant not in self._dirs:
            self._dirs[variant] = build_fake_nvml(self.root / variant, VARIANTS[variant])
        return self._dirs[variant]


@pytest.fixture(scope="session")
def fake_nvml_builds(tmp_path_factory: pytest.TempPathFactory) -> FakeNvmlBuilds:
    return FakeNvmlBuilds(tmp_path_factory.mktemp("fakenvml"))


def _fake(builds: FakeNvmlBuilds, variant: str, tmp_path: Path) -> FakeNvml:
    fake = FakeNvml(builds.lib_dir(variant), tmp_path / "fakenvml.state")
    fake.set_gpus([24 * fakestate.GiB, 24 * fakestate.GiB])
    return fake


@pytest.fixture
def fake_nvml(fake_nvml_builds: FakeNvmlBuilds, tmp_path: Path) -> FakeNvml:
    return _fake(fake_nvml_builds, "full", tmp_path)


@pytest.fixture
def fake_nvml_no_v2(fake_nvml_builds: FakeNvmlBuilds, tmp_path: Path) -> FakeNvml:
    return _fake(fake_nvml_builds, "no_memory_v2", tmp_path)


@pytest.fixture
def fake_nvml_old(fake_nvml_builds: FakeNvmlBuilds, tmp_path: Path) -> FakeNvml:
    return _fake(fake_nvml_builds, "old", tmp_path)


_preloaded: ctypes.CDLL | None = None


@pytest.fixture
def fake_nvml_inproc(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """fake_nvml, visible to pynvml in this process (FAKENVML_STATE set for the test)."""
    global _preloaded  # noqa: PLW0603  (one library per process: see the module docstring)
    if _preloaded is None:
        import pynvml  # type: ignore[import-untyped]

        if pynvml.nvmlLib is not None:
            pytest.skip("pynvml already loaded another libnvidia-ml.so.1 in this process")
        # Loaded by path, this library's soname satisfies pynvml's later dlopen by name.
        _preloaded = ctypes.CDLL(str(fake_nvml.lib_path), mode=ctypes.RTLD_GLOBAL)
    monkeypatch.setenv("FAKENVML_STATE", str(fake_nvml.state_path))
    return fake_nvml
