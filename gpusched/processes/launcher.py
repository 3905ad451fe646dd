"""The launcher: starts jobs under their supervisor, watches them, stops them.

The launcher is the daemon's truth about processes. It writes each job's spec to
the state directory, has the zygote (gpusched.processes.zygote) fork a supervisor for it, or
when the zygote is gone or not answering starts `python -m gpusched.processes.supervisor` in a
new session itself, and has the exit watcher (gpusched.processes.exit_watcher) report when
the supervisor exits. Its outcome is then read from `exit.json` (written by the supervisor
before it exits).

A process is identified by its pid *and* its start time: after a restart, a pid
recorded in the database may belong to an unrelated process by now.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from gpusched.config.holder import ConfigHolder
from gpusched.core.models import Job
from gpusched.processes import cgroups, cpusets, devices
from gpusched.processes.durable import is_blank, reserve_record, write_json_atomically
from gpusched.processes.exit_watcher import ExitWatcher
from gpusched.processes.launching import (
    HostFacts,
    Outcome,
    OutcomeKind,
    Started,
    StartError,
    start_error,
)
from gpusched.processes.move_warmer import MoveWarmer
from gpusched.processes.output import job_log_path
from gpusched.processes.pidref import is_same_process, process_start_time
from gpusched.processes.zygote import recorded_pid, recorded_supervisor

log = logging.getLogger("gpusched.launcher")

# The share of the service's memory that jobs' caps divide between them; the rest is the
# daemon's, the zygote's and the supervisors'.
JOBS_MEMORY_SHARE = 0.9

# How long a fork request may wait for the zygote's answer: the first after a (re)start
# waits for its interpreter (a fraction of a second); a fork takes about a millisecond.
ZYGOTE_REPLY_TIMEOUT_S = 10.0

SUPERVISOR_MODULE = "gpusched.processes.supervisor"
# Earlier versions' supervisor modules: after an upgrade in place, a job whose pid was
# never recorded is still found by its supervisor's command line. May be dropped in 0.3.0,
# once no supervisor started as `gpusched.supervisor` (by a 0.1.x daemon from before the
# layer packages, or through the gpusched/supervisor.py shim) can still be running.
LEGACY_SUPERVISOR_MODULES: tuple[str, ...] = ("gpusched.supervisor",)


def supervisor_command(spec_path: Path, module: str = SUPERVISOR_MODULE) -> list[str]:
    return [sys.executable, "-m", module, str(spec_path)]


def zygote_command(control_fd: int, jobs_dir: Path) -> list[str]:
    return [sys.executable, "-m", "gpusched.processes.zygote", str(control_fd), str(jobs_dir)]


def find_supervisor(spec_path: Path) -> int | None:
    """The pid of a live supervisor for this spec (a daemon may have died before recording it).

    A supervisor forked by the zygote shows a title, not that command line: it is found by
    the identity the zygote recorded next to the spec; one started directly, by its
    command line and our user (it drops privileges for the job alone).
    """
    pid = recorded_supervisor(spec_path.parent)
    if pid is not None:
        return pid
    # Any user can give a process this command line; only we can start one as our user. An
    # impostor adopted would hold the job `running` for good and take its cancel.
    wanted = [
        supervisor_command(spec_path, module)[1:]
        for module in (SUPERVISOR_MODULE, *LEGACY_SUPERVISOR_MODULES)
    ]
    for process in psutil.process_iter(["cmdline", "uids"]):
        cmdline = process.info.get("cmdline") or []
        uids = process.info.get("uids")
        if cmdline[1:] in wanted and uids is not None and uids.real == os.geteuid():
            return process.pid
    return None


def _no_listener(job_id: int) -> None:
    log.warning("job %s's supervisor exited with nobody listening", job_id)


class Launcher:
    """Starts, watches and stops job supervisors (see `JobLauncher` for the interface).

    `config`: read when a job starts (its `kill_grace`), so a reload reaches the next
    job; the directories are fixed at start. `on_exit(job_id)` is set by whoever settles
    endings (the scheduler), before the first job starts or is re-adopted.
    """

    def __init__(self, config: ConfigHolder, gpu_count: int = 1) -> None:
        self._config = config
        self._gpu_count = max(1, gpu_count)  # a job's default host memory: its GPUs' share
        self.jobs_dir = config.current.state_dir / "jobs"
        self.log_dir = config.current.log_dir
        self.on_exit: Callable[[int], None] = _no_listener
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # guards _children
        self._watcher = ExitWatcher(self._exits)
        self._zygote: subprocess.Popen[bytes] | None = None
        self._zygote_channel: socket.socket | None = None
        self._zygote_lock = threading.Lock()
        self._zygote_warned = False
        self._service: cgroups.MemoryCgroup | None = None  # jobs' cgroups go under it
        self._warmer: MoveWarmer | None = None  # with job cgroups: their moves' lock
        self._jobs_budget = 0  # with job cgroups: the memory their caps divide
        # Where jobs' cpusets go, or why they have none; the machine's memory (read once).
        self._cpusets: cpusets.CpusetRoot | str = cpusets.NOT_ROOT
        self._memory_total = _memory_total()
        self._devices: devices.DevicesService | None = None  # jobs' devices cgroups under it

    def protect(self) -> None:
        """At the daemon's start (as root): protect it from the OOM killer (the zygote and
        every supervisor inherit that) and lay out its cgroups (gpusched.processes.cgroups)."""
        if os.geteuid() != 0:
            return
        if not cgroups.set_oom_score_adj(cgroups.OOM_SCORE_ADJ_PROTECTED):
            log.warning(
                "cannot lower the daemon's oom_score_adj (no CAP_SYS_RESOURCE; the unit's"
                " OOMScoreAdjust= does it): jobs start %s above it instead",
                cgroups.OOM_SCORE_ADJ_GAP,
            )
        self._service = cgroups.prepare_service()
        if self._service is None:
            log.warning(
                "no writable memory cgroup: jobs share the daemon's (no host_oom; --ram is refused)"
            )
        else:
            self._warmer = MoveWarmer(self._service.path / cgroups.DAEMON_LEAF)
            v, where = self._service.version, self._service.path
            log.info("cgroups (v%s): daemon in %s/daemon, each job in %s/job-ID", v, where, where)
            try:
                self._jobs_budget = int(cgroups.memory_budget(self._service) * JOBS_MEMORY_SHARE)
            except (OSError, ValueError) as exc:
                log.warning("cannot read the service's memory limit (%s): jobs uncapped", exc)
        reserve = self._config.current.host.cpu_reserve
        self._cpusets = cpusets.prepare_root(self._service, self.jobs_dir.parent, reserve)
        if isinstance(self._cpusets, str):
            log.warning("no cpuset cgroups (%s): --cpus is refused", self._cpusets)
        self._devices = devices.prepare_service()
        if self._devices is None:
            why = devices.fencing_unavailable() or (
                "the devices cgroup is not the daemon's alone: a job's GPUs are not fenced"
                if devices.own_devices_cgroup() is not None
                else "the daemon's cgroup v2 is not its alone: a job's GPUs are not fenced"
            )
            log.warning("%s; a job that ignores CUDA_VISIBLE_DEVICES can open every card", why)
        else:
            by = "devices cgroups" if self._devices.version == 1 else "BPF device programs"
            log.info("GPUs fenced per job: %s on %s/job-ID", by, self._devices.path)

    def host_facts(self) -> HostFacts:
        """What the host rule counts (`JobLauncher.host_facts`): the service's memory for
        jobs (its memory less the daemon's part), the cores a job's cpuset may take."""
        root = self._cpusets
        no_memory = None
        if self._service is None or self._jobs_budget <= 0:
            no_memory = "no writable memory cgroup here" if os.geteuid() == 0 else cpusets.NOT_ROOT
        return HostFacts(
            total_bytes=self._memory_total,
            service_bytes=self._jobs_budget or None,
            cores=root.cores if not isinstance(root, str) else tuple(_own_cores()),
            gpu_count=self._gpu_count,
            no_memory=no_memory,
            no_cpuset=root if isinstance(root, str) else None,
        )

    def confine_client(
        self, job: Job, pid: int, start_time: str | None, deny: Sequence[str] = ()
    ) -> None:
        """`JobLauncher.confine_client` (gpusched.processes.cpusets.confine, and the
        devices cgroup a batch job's supervisor makes)."""
        if not is_same_process(pid, start_time):  # never another process given its pid
            raise StartError("its process has gone")
        fence = self._fence_spec(job.id, deny)
        try:
            if fence is not None:  # the fence first: never placed with every card open
                path = Path(fence["path"])
                devices.make_job_cgroup(path, fence["deny"], fence["version"])
                (path / "cgroup.procs").write_text(str(pid))
            cpusets.confine(self._service, self._cpusets, job.id, pid, (job.ram, job.cpus))
        except devices.FenceError as exc:
            raise StartError(str(exc)) from None
        except OSError as exc:
            raise start_error("cannot put the job's process in its cgroups", exc) from None

    def release_client(self, job_id: int) -> None:
        # Its client reports the end and then exits: the cgroups empty a moment later,
        # waited for apart from the pass that settled the end.
        threading.Thread(
            target=self._release_client,
            args=(job_id,),
            name=f"release-{job_id}",
            daemon=True,
        ).start()

    def _release_client(self, job_id: int) -> None:
        cpusets.release(self._service, self._cpusets, job_id)
        if self._devices is not None:  # on cgroup v2 the memory cgroup's own directory
            path = cgroups.MemoryCgroup(self._devices.path / f"job-{job_id}", 1)
            cgroups.remove_job_cgroup(path, wait_s=cpusets.RELEASE_WAIT_S)

    @property
    def fences_devices(self) -> bool:
        """Whether jobs get a devices cgroup (v1's, the daemon's own, or a device program
        on their v2 cgroup: see `protect`)."""
        return self._devices is not None

    def _fence_spec(self, job_id: int, deny: Sequence[str]) -> dict[str, Any] | None:
        """A job's devices cgroup and the other cards' nodes to deny there, for its spec."""
        if self._devices is None or not deny:
            return None
        path, version = self._devices.path / f"job-{job_id}", self._devices.version
        return {"path": str(path), "version": version, "deny": list(deny)}

    def host_mem_limit(self, job: Job) -> int | None:
        """The cap on a job's host memory (its cgroup's): its `--ram`, which the scheduler
        fills in before the start with its GPUs' share when it gave none (the host rule,
        gpusched.scheduling.host_limits). None without job cgroups."""
        if self._service is None or self._jobs_budget <= 0:
            return None
        return job.ram

    # -- the zygote ---------------------------------------------------------------------

    def start_zygote(self) -> None:
        """Start the zygote that forks supervisors (the daemon does at start-up).

        Does not wait for it: the first fork request queues in the channel meanwhile.
        """
        with self._zygote_lock:
            self._start_zygote_locked()

    def _start_zygote_locked(self) -> None:
        # SOCK_SEQPACKET: one request, one reply, kept apart by the kernel. The daemon's
        # end is close-on-exec, so no job, hook or fallback supervisor ever holds it.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._zygote = subprocess.Popen(
                zygote_command(theirs.fileno(), self.jobs_dir),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            report = log.info if self._zygote_warned else log.warning
            report("cannot start the supervisor zygote (%s): starting jobs directly", exc)
            self._zygote_warned = True
            return
        finally:
            theirs.close()
        ours.settimeout(ZYGOTE_REPLY_TIMEOUT_S)
        self._zygote_channel = ours
        log.info("supervisor zygote started (pid %s)", self._zygote.pid)

    def _stop_zygote_locked(self, kill: bool) -> None:
        """Close the channel (the zygote exits on end of file) and reap it."""
        if self._zygote_channel is not None:
            self._zygote_channel.close()
            self._zygote_channel = None
        if self._zygote is not None:
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    self._zygote.kill()
            try:
                self._zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None

    def _fork_via_zygote(self, spec_path: Path) -> int | None:
        """A supervisor forked by the zygote; None: start one directly instead.

        Never both: when the zygote fails mid-request it is killed and reaped first; then
        the job has a supervisor if and only if the zygote recorded one (a forked child
        runs only when its identity is on record), and that one is taken.
        """
        with self._zygote_lock:
            if self._zygote is None:  # never started, or it could not be: try now
                self._start_zygote_locked()
            channel = self._zygote_channel
            if self._zygote is None or channel is None:
                return None  # could not start one (said so)
            if self._zygote.poll() is not None:
                self._zygote_failed("exited")
                return None
            try:
                channel.send(os.fsencode(spec_path))
                reply = channel.recv(4096).decode()
            except (OSError, UnicodeDecodeError) as exc:  # a timeout is an OSError too
                reply = f"no answer ({exc.__class__.__name__}: {exc})"
            if reply.isdigit():
                return int(reply)
            if reply.startswith("error: "):  # it answered: no child was left behind
                log.warning("the supervisor zygote could not fork: %s", reply[7:])
                return None
            self._stop_zygote_locked(kill=True)
            # Alive or not: a recorded child may run (or have run) the job already.
            recorded = recorded_pid(spec_path.parent)
            self._zygote_failed(reply or "it closed its channel")
            return recorded

    def _zygote_failed(self, why: str) -> None:
        """Start this job directly; start a new zygote for the next one."""
        self._stop_zygote_locked(kill=True)
        report = log.info if self._zygote_warned else log.warning
        report("supervisor zygote %s: starting a job's supervisor directly; restarting it", why)
        self._zygote_warned = True
        self._start_zygote_locked()

    def _cpuset_of(self, job: Job) -> dict[str, object] | None:
        if isinstance(self._cpusets, str) or not job.cpus:
            return None
        try:
            return cpusets.assign(self._cpusets, job.id, job.cpus)
        except OSError as exc:
            raise start_error("cannot make the job's cpuset", exc) from None

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    def job_ids(self) -> list[int]:
        """The jobs this server keeps a directory for (those it started), in id order."""
        try:
            names = [entry.name for entry in os.scandir(self.jobs_dir)]
        except FileNotFoundError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def log_path(self, job_id: int) -> Path:
        return self.log_dir / f"{job_id}.log"

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
        """Hand the job to a new supervisor. Raises StartError with a message for the owner.
        `deny_devices`: the other cards' device rules (gpusched.processes.devices)."""
        if self._warmer is not None:  # its supervisor's cgroup move waits less
            self._warmer.warm()
        try:
            entry = pwd.getpwuid(job.uid)
        except KeyError:
            raise StartError(f"the job's owner (uid {job.uid}) no longer exists") from None
        groups = os.getgrouplist(entry.pw_name, gid) if os.geteuid() == 0 else []
        job_dir = self.job_dir(job.id)
        try:
            # The job dir is root's (0700): only the daemon and supervisor read the spec.
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(job_dir)
            job_dir.mkdir(parents=True, mode=0o700)
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise start_error("cannot prepare job directories", exc) from None
        log_path = job_log_path(job, str(self.log_path(job.id)))
        spec: dict[str, Any] = {
            "job_id": job.id,
            "argv": job.command,
            "cwd": job.cwd,
            "env": env,
            "uid": job.uid,
            "gid": gid,
            "groups": groups,
            "umask": umask,
            "log_path": log_path,
            # `--output`: a path of the user's, opened as them (gpusched.processes.output).
            "log_as_owner": bool(job.output),
            "kill_grace_s": self._config.current.kill_grace_s,
            # the supervisor keeps the job's log under it (read at start, as kill_grace)
            "max_log_bytes": self._config.current.max_log_bytes,
            "time_limit_s": job.time_limit_s,
            # Its own memory cgroup and /dev/shm (gpusched.processes.cgroups, .shm).
            "cgroup": None
            if self._service is None
            else {
                "path": str(self._service.path / f"job-{job.id}"),
                "version": self._service.version,
                "limit": self.host_mem_limit(job),
            },
            # Its own cores (gpusched.processes.cpusets), made here before it starts.
            "cpuset": self._cpuset_of(job),
            "private_shm": os.geteuid() == 0,
            "devices": self._fence_spec(job.id, deny_devices),
            "exec_by": exec_by,  # CLOCK_MONOTONIC: no exec past it (a cluster's fence)
        }
        spec_path = job_dir / "spec.json"
        try:
            _write_spec(spec_path, spec)
        except StartError:
            if spec["cpuset"] is not None:  # no supervisor will remove it: it counts as used
                cpusets.remove_job_cpuset(Path(spec["cpuset"]["path"]))
            raise
        pid = self._fork_via_zygote(spec_path)
        via = "zygote"
        if pid is None:
            pid, via = self._popen_supervisor(spec_path), "popen"
        start_time = process_start_time(pid) or "0"
        self.watch(job.id, pid, start_time)
        return Started(pid, start_time, log_path, via)

    def _popen_supervisor(self, spec_path: Path) -> int:
        """Start a supervisor in a fresh interpreter, in a new session: the slow, sure way."""
        try:
            with open(spec_path.with_name("supervisor.err"), "wb") as supervisor_err:
                process = subprocess.Popen(
                    supervisor_command(spec_path),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=supervisor_err,
                    start_new_session=True,
                    close_fds=True,
                    cwd="/",
                )
        except OSError as exc:
            raise start_error("cannot start the job's supervisor", exc) from None
        with self._lock:
            self._children[process.pid] = process
        return process.pid

    def watch(self, job_id: int, pid: int, start_time: str | None = None) -> None:
        """Call on_exit(job_id) once `pid` exits (also for supervisors adopted after a restart).

        on_exit is always called from the watcher thread, never from here: the caller
        may be in the middle of a scheduling pass, where an end must not be settled.
        `start_time` (process_start_time) tells the process from a later one with its pid
        while it has to be polled.
        """
        self._watcher.watch(job_id, pid, start_time)

    def _exits(self, job_ids: list[int]) -> None:
        if self._warmer is not None:  # an end usually starts the next job: warm its move
            self._warmer.warm()
        self._reap_children()
        for job_id in job_ids:
            try:
                self.on_exit(job_id)
            except Exception:  # the watcher must outlive any bug in a callback
                log.exception("handling the exit of job %s failed", job_id)

    def _reap_children(self) -> None:
        with self._lock:
            for pid, process in list(self._children.items()):
                if process.poll() is not None:
                    del self._children[pid]

    def outcome(self, job_id: int) -> Outcome:
        """How the job ended, from its supervisor's record; `lost` when there is none."""
        path = self.job_dir(job_id) / "exit.json"
        try:
            raw = path.read_bytes()
            if is_blank(raw):  # reserved at the start, never written
                raise FileNotFoundError(path)
            data = json.loads(raw)
        except FileNotFoundError:
            err = self.job_dir(job_id) / "supervisor.err"
            detail = ""
            with contextlib.suppress(OSError):
                detail = err.read_text().strip().splitlines()[-1] if err.stat().st_size else ""
            why = "its supervisor ended without recording an exit status"
            return Outcome(OutcomeKind.LOST, message=f"{why}: {detail}" if detail else why)
        except (OSError, ValueError) as exc:
            return Outcome(OutcomeKind.LOST, message=f"unreadable exit record: {exc}")
        return Outcome(
            OutcomeKind.read(data.get("outcome")),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            message=data.get("message"),
            transient=data.get("transient") is True,
            run_s=_seconds(data.get("run_s")),
            host_peak_bytes=_count(data.get("host_peak")),
            cpu_s=_seconds(data.get("cpu_s")),
        )

    def forget(self, job_id: int) -> None:
        """Remove a job's directory once its end is recorded (gpusched.store.retention)."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def find_supervisor(self, job_id: int) -> int | None:
        """A live supervisor of this job that no pid was recorded for (see find_supervisor)."""
        return find_supervisor(self.job_dir(job_id) / "spec.json")

    def start_time(self, pid: int) -> str | None:
        return process_start_time(pid)

    def is_running(self, pid: int, start_time: str | None) -> bool:
        """Whether the supervisor `pid` that started at `start_time` is still alive."""
        return is_same_process(pid, start_time)

    def cancel(self, pid: int, start_time: str | None) -> bool:
        """Ask a job's supervisor to stop the job's tree (SIGTERM, grace, SIGKILL)."""
        if not is_same_process(pid, start_time):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        return True

    def close(self) -> None:
        """Stop watching and the zygote. Jobs keep running: their supervisors are in their
        own sessions."""
        with self._zygote_lock:
            self._stop_zygote_locked(kill=False)
        self._watcher.close()
        if self._warmer is not None:
            self._warmer.close()
        if not isinstance(self._cpusets, str):
            cpusets.release_root(self._cpusets)


def _seconds(value: object) -> float | None:
    """A duration from an exit record: a non-negative number, else unknown."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _memory_total() -> int:
    try:
        return cgroups.memory_total()
    except (OSError, ValueError):
        return 0


def _own_cores() -> set[int]:
    return os.sched_getaffinity(0)


def _write_spec(spec_path: Path, spec: dict[str, Any]) -> None:
    """The job's spec and its exit record's space; StartError where either fails."""
    try:
        # The exit record's space, taken now: the job's end is written there even if
        # the disk fills while it runs (gpusched.processes.durable).
        reserve_record(spec_path.parent / "exit.json")
    except OSError as exc:
        raise start_error("cannot reserve space for the job's exit record", exc) from None
    try:
        # No fsync: the spec must outlive the daemon, not a power cut; after a crash of
        # the machine the job's fate is settled from its exit record, never its spec.
        write_json_atomically(spec_path, spec, durable=False)
    except OSError as exc:
        raise start_error("cannot write the job's spec", exc) from None


def _count(value: object) -> int | None:
    """A byte count from an exit record: a non-negative int, else unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
