"""Test doubles of gpusched's interfaces (never of its modules' internals).

`FakeLauncher` implements `gpusched.processes.launching.JobLauncher` in memory: a started job gets a
pid no process has, and ends only when the test says how (`finish`), as its supervisor's
exit record would. `FakeProbe` implements `gpusched.gpus.probe.Probe` with GPUs whose processes
the test sets. `FixedClock` is a clock (wall and monotonic) that moves only when told. With them,
`Scheduler.tick()` runs one scheduling pass at a time and spawns nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpusched.core.models import GpuProcess, GpuState, Job
from gpusched.processes.launching import HostFacts, Outcome, OutcomeKind, Started, StartError

GiB = 2**30
# Above the kernel's largest pid (2**22): never the pid of a real process.
_FAKE_PIDS = itertools.count(10_000_000)


class FixedClock:
    def __init__(self, start: str = "2026-01-05T09:00:00+00:00") -> None:
        self.now = datetime.fromisoformat(start).astimezone(timezone.utc)
        self.elapsed_s = 0.0

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.elapsed_s

    def epoch_s(self) -> float:
        """The wall time in seconds since 1970: a database's clock, for the leases."""
        return self.now.timestamp()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.elapsed_s += seconds


class SkewedClock:
    """A server's clock `skew_s` off another's (the wall time only: intervals agree)."""

    def __init__(self, clock: FixedClock, skew_s: float) -> None:
        self.clock, self.skew_s = clock, skew_s

    def __call__(self) -> datetime:
        return self.clock() + timedelta(seconds=self.skew_s)

    def monotonic(self) -> float:
        return self.clock.monotonic()


class FakeLauncher:
    """Jobs that run until the test finishes them; nothing is forked."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.on_exit: Callable[[int], None] = lambda job_id: None
        self.running: dict[int, int] = {}  # job id -> pid, while its "supervisor" lives
        self.outcomes: dict[int, Outcome] = {}
        self.stop_requests: list[int] = []  # job ids whose supervisor was asked to stop
        self.refuse: dict[int, str] = {}  # job id -> StartError message
        self.busy: set[int] = set()  # job ids whose next start fails for now (transient)
        self.started: list[int] = []
        self.exec_by: dict[int, float | None] = {}  # job id -> the deadline it was given
        # What the host rule counts (no job cgroups unless a test gives some), and each
        # started job's memory limit and cpuset size as the scheduler handed them over.
        self.facts = HostFacts()
        self.limits: dict[int, tuple[int | None, int | None]] = {}
        self.released: list[int] = []  # interactive jobs whose cgroups were released
        self.fences_devices = False  # no devices cgroups: CUDA numbers every card

    def log_path(self, job_id: int) -> Path:
        return self.log_dir / f"{job_id}.log"

    def host_facts(self) -> HostFacts:
        return self.facts

    def confine_client(
        self, job: Job, pid: int, start_time: str | None, deny: Sequence[str] = ()
    ) -> None:
        self.limits[job.id] = (job.ram, job.cpus)

    def release_client(self, job_id: int) -> None:
        self.released.append(job_id)

    def start(
        self,
        job: Job,
        env: dict[str, str],
        umask: int,
        gid: int,
        *,
        exec_by: float | None = None,
        deny_devices: Sequence[str] = (),
    ) -> Started:
        self.exec_by[job.id] = exec_by
        self.limits[job.id] = (job.ram, job.cpus)
        if job.id in self.refuse:
            raise StartError(self.refuse[job.id])
        if job.id in self.busy:
            self.busy.discard(job.id)
            raise StartError("no tasks left", transient=True)
        pid = next(_FAKE_PIDS)
        self.running[job.id] = pid
        self.started.append(job.id)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path(job.id).touch()  # as the supervisor opens the job's log
        return Started(pid, self._start_time(pid), str(self.log_path(job.id)), via="fake")

    def finish(self, job_id: int, outcome: Outcome) -> None:
        """The job's supervisor records `outcome` and exits; the watcher reports it."""
        self.outcomes[job_id] = outcome
        del self.running[job_id]
        self.on_exit(job_id)

    def watch(self, job_id: int, pid: int, start_time: str | None = None) -> None:
        self.running[job_id] = pid

    def outcome(self, job_id: int) -> Outcome:
        return self.outcomes.get(job_id, Outcome(OutcomeKind.LOST, message="no exit record"))

    def cancel(self, pid: int, start_time: str | None) -> bool:
        for job_id, running_pid in self.running.items():
            if running_pid == pid and start_time == self._start_time(pid):
                self.stop_requests.append(job_id)
                return True
        return False

    def find_supervisor(self, job_id: int) -> int | None:
        return self.running.get(job_id)

    def start_time(self, pid: int) -> str | None:
        return self._start_time(pid) if pid in self.running.values() else None

    def is_running(self, pid: int, start_time: str | None) -> bool:
        return pid in self.running.values() and start_time == self._start_time(pid)

    def start_zygote(self) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def _start_time(pid: int) -> str:
        return f"{pid}.0"


class FakeProbe:
    """GPUs of the given sizes; `hold` makes a process use memory on one."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.gpus = [
            GpuState(i, f"GPU-fake-{i}", "Fake GPU", size, 0, size, 0)
            for i, size in enumerate(sizes)
        ]
        self.held: dict[tuple[int, str], int] = {}  # (pid, uuid) -> bytes

    def uuid(self, index: int) -> str:
        return self.gpus[index].uuid

    def hold(self, pid: int, index: int, used: int) -> None:
        self.held[(pid, self.uuid(index))] = used

    def snapshot(self) -> list[GpuState]:
        states = []
        for gpu in self.gpus:
            procs = tuple(GpuProcess(pid, b) for (pid, u), b in self.held.items() if u == gpu.uuid)
            used = sum(p.used_bytes or 0 for p in procs)
            states.append(
                replace(gpu, used_bytes=used, free_bytes=gpu.total_bytes - used, processes=procs)
            )
        return states

    def note_job_started(
        self,
        pid: int,
        gpu_uuids: Sequence[str],
        mem_bytes: int | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        pass  # a fake job holds only what the test says it holds

    def describe(self) -> str:
        return f"{len(self.gpus)} fake GPU(s)"

    def close(self) -> None:
        pass
