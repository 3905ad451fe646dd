"""The Python API: one request to the daemon per call, over its Unix socket.

    from gpusched import Client
    client = Client()                      # finds the daemon as the CLI does
    job = client.submit(["python", "train.py"], mem="8G")
    job = client.wait(job.id)              # a Job; wait([ids]) returns a list
    print(job.state, job.exit_code)

Every method returns plain data from gpusched.core.models (`Job`, `GpuReport`) and raises a
`gpusched.core.errors.GpuschedError` subclass with a one-line message on failure
(`DaemonUnreachable` when no daemon answers). The CLI is built on this. It imports no
SQLAlchemy, APScheduler or pynvml.
"""

from __future__ import annotations

import os
import time

from gpusched.connection import DaemonConnection
from gpusched.core.errors import ProtocolError
from gpusched.core.requests.protocol import (
    VERSION,
    compatible_versions,
    version_mismatch,
)

TYPE_CHECKING = False  # typing's own import costs every `gpusched status`
if TYPE_CHECKING:  # the reply types, for mypy only: a reply is a plain dict at run time
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any, overload

    from gpusched.core.models import Drain, Job, LogChunk, Status
    from gpusched.core.requests.base import Request
    from gpusched.core.requests.replies import EstimateHistoryReply, PingReply, PruneReply

# The models (gpusched.core.models) and the request classes (gpusched.core.requests) are
# imported by the method that needs them: `gpusched status` starts without creating their
# dataclasses, asking through the frames of gpusched.core.status_pages.


class Client:
    """A connection to one gpusched daemon (each call opens and closes the socket).

    The socket is `socket_path` if given, else $GPUSCHED_SOCKET, else the one named by
    the config file (`config_path`, $GPUSCHED_CONFIG, /etc/gpusched/config.yaml as root),
    else the system service's whenever one is installed (even while it restarts: it is
    asked again for `restart_wait_s`), else the user's own daemon's
    (gpusched.daemon_socket).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """`timeout_s`: give up on a connect or a reply after this long (default 5 s to
        connect, 120 s for a reply)."""
        self.connection = DaemonConnection(socket_path, config_path, timeout_s=timeout_s)

    @property
    def socket_path(self) -> Path:
        return self.connection.socket_path

    @property
    def system_service(self) -> bool:
        """Whether this client talks to the system service (rather than a personal daemon)."""
        return self.connection.system_service

    @property
    def restart_wait_s(self) -> float:
        return self.connection.restart_wait_s

    @restart_wait_s.setter
    def restart_wait_s(self, seconds: float) -> None:
        self.connection.restart_wait_s = seconds

    @property
    def follow_s(self) -> float:
        """How long each request keeps trying while the daemon is away (restarting), also
        when it left in the middle of one: for callers whose requests are safe to send
        again (`wait`, `logs -f`). 0 (the default): only the system service's connect."""
        return self.connection.follow_s

    @follow_s.setter
    def follow_s(self, seconds: float) -> None:
        self.connection.follow_s = seconds

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raise the daemon's error as a GpuschedError."""
        return self.connection.request(op, **args)

    def send(self, request: Request) -> Any:
        """Send a request object (gpusched.core.requests.catalog, checked as it was built)."""
        wire = request.to_wire()
        return self.request(wire.pop("op"), **wire)

    def ping(self) -> PingReply:
        """{"version", "pid", "daemon_user", "daemon_uid", "user", "uid"}: who answers, and
        who the daemon thinks is asking."""
        from gpusched.core.requests import catalog as rq

        reply: PingReply = self.send(rq.PingRequest())
        return reply

    def check_version(self) -> PingReply:
        """Ping, and refuse (ProtocolError) a daemon whose version this client cannot talk to
        (gpusched.core.requests.protocol.compatible_versions); the ping's answer otherwise."""
        info = self.ping()
        daemon = str(info.get("version") or "")
        if daemon and not compatible_versions(VERSION, daemon):
            raise ProtocolError(version_mismatch(VERSION, daemon))
        return info

    def submit(
        self,
        command: Sequence[str],
        *,
        mem: str | int | None = None,
        gpus: int = 1,
        name: str | None = None,
        priority: int = 0,
        after: Sequence[int] = (),
        hold: bool = False,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        time_limit: str | float | None = None,
        notify: str | Sequence[str] | None = None,
        retry_oom: int = 0,
        nodes: Sequence[str] | None = None,
        requeue: bool = False,
        exclusive: bool = False,
        share: bool = False,
        output: str | None = None,
        after_when: Sequence[str] | None = None,
        ram: str | int | None = None,
        cpus: int | None = None,
    ) -> Job:
        """Queue a command. `mem` is per GPU ("8G" or bytes); None asks for whole GPUs;
        "auto" takes `estimate_history()`'s suggestion (NotFoundError if there is none).

        `retry_oom`: if the job runs out of GPU memory, queue it again (in its place)
        with 1.5x the memory, up to this many times.
        `nodes`: only these servers of a cluster may run it; `requeue`: if its server
        dies while it runs, queue it again instead of ending it `lost`.
        `exclusive`: a card to itself; `share`: it is light, it may share a busy card.
        `after`: jobs that must end first, each as `after_when` says, one per id in its
        order: "ok" (it succeeded, the default), "any" (it ended, however) or "failed"
        (it ended without succeeding); the job is ended (`dependency_failed`) when one can
        no longer hold.

        `time_limit` ("2h" or seconds): the job is stopped (reason `timeout`) past it.
        `notify`: a command run as you when the job ends, with the job's JSON on stdin
        (a string is split like a shell would, but no shell runs it).
        `output`: the job's log goes to this file, opened as you ({id}, {array}, {index}
        in its name; relative to `cwd`), instead of the daemon's log_dir.
        `ram` ("24G" or bytes): the job's host memory, its cgroup's limit, reserved for it
        as it starts; `cpus`: cores of its own (a cpuset). None: its GPUs' share of the
        server's (docs/operations.md, "Host memory and cores").
        """
        options = dict(locals())  # every option as given, by name: the parameters above
        del options["self"], options["command"]
        options["nodes"] = None if nodes is None else tuple(nodes)
        options["after_when"] = None if after_when is None else tuple(after_when)
        return _job(self._submit(command, **options))

    def submit_sweep(
        self,
        command: Sequence[str],
        sweep: Sequence[tuple[str, Sequence[str]]],
        *,
        max_concurrent: int | None = None,
        **options: Any,
    ) -> list[Job]:
        """Queue one job per combination of `sweep` values as one array.

        Each `{name}` in the command is replaced, e.g. sweep=[("lr", ["0.1", "0.01"])]
        with command ["python", "train.py", "--lr", "{lr}"]. Takes submit()'s options.
        """
        result = self._submit(
            command,
            sweep=tuple((key, tuple(values)) for key, values in sweep),
            max_concurrent=max_concurrent,
            **options,
        )
        return [_job(job) for job in result]

    def _submit(self, command: Sequence[str], **options: Any) -> Any:
        # Only submitting needs these: `status` and `show` start without them.
        from gpusched.submitter import send_submit, submit_request

        request = submit_request(command, suggested_mem=self._suggested_mem, **options)
        return send_submit(lambda: self.send(request), request.request_id, self.socket_path)

    def _suggested_mem(self, argv: tuple[str, ...]) -> int:
        """`--mem auto`: estimate_history's suggestion for a command already resolved."""
        from gpusched.core.requests import catalog as rq

        return int(self.send(rq.EstimateHistoryRequest(argv))["suggested_mem"])

    def submitted(self, request_id: str) -> list[Job]:
        """What became of a submit (its request id, as a failed submit's error says): the
        jobs it queued; NotFoundError if it queued none."""
        from gpusched.core.requests import catalog as rq

        return [_job(job) for job in self.send(rq.SubmittedRequest(request_id))]

    def estimate_history(
        self,
        command: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> EstimateHistoryReply:
        """A --mem for `command` from the peaks of your earlier successful runs of it:
        {"command", "jobs": [{"id", "peak_mem", "mem"}...], "peak_mem", "suggested_mem"}.

        The command is resolved as `submit` resolves it (so `train.py` matches the runs
        submitted as `train.py`). NotFoundError when there is no such run.
        """
        from gpusched.core.requests import catalog as rq
        from gpusched.submitter import resolve_command

        workdir = os.path.abspath(cwd if cwd is not None else os.getcwd())
        environment = dict(os.environ if env is None else env)
        argv = resolve_command(command, workdir, environment.get("PATH"))
        reply: EstimateHistoryReply = self.send(rq.EstimateHistoryRequest(tuple(argv)))
        return reply

    def status(self, all: bool = False) -> Status:
        """GPUs and active jobs (`all`: recently ended jobs too), every page of them."""
        from gpusched.core.models import Status

        return Status.from_json(self.status_reply(all=all))

    def status_reply(
        self,
        all: bool = False,
        states: Sequence[str] | None = None,
        first: int | None = None,
        user: str | None = None,
        ended: int | None = None,
    ) -> dict[str, Any]:
        """The daemon's `status` reply as JSON, its pages joined: {"gpus", "jobs", "drain",
        "counts"}. `states`: only active jobs in these states (recently ended ones too with
        `all`); `first`: stop after this many jobs (the rest are only counted in "counts");
        `user`: only that user's jobs; `ended`: with `all`, this many recent ends (the
        daemon's default: 20).

        The daemon answers in pages (`status_page_jobs` each) so that any queue fits;
        a job is listed once, in the state it had when its page was read.
        """
        from gpusched.core.status_pages import joined_pages, status_wire

        wire = status_wire(all=all, states=states, first=first, user=user, ended=ended)
        return joined_pages(
            lambda cursor: self.request("status", **{**wire, "cursor": cursor or 0}),
            all=all,
            states=states,
            first=first,
        )

    def job(self, job_id: int) -> Job:
        """One job by id (NotFoundError if there is none)."""
        from gpusched.core.requests.views import ShowRequest

        return _job(self.send(ShowRequest(job_id)))

    def cancel(self, job_id: int) -> Job:
        """Cancel a job; returns it as it is right after the request (it may still be
        running for up to `kill_grace` while it stops)."""
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.CancelRequest(id=job_id)))

    def set_priority(self, job_id: int, priority: int) -> Job:
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.PriorityRequest(job_id, priority)))

    def put_first(self, job_id: int) -> Job:
        """An administrator puts a waiting job ahead of every user's (`gpusched top`)."""
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.TopRequest(job_id)))

    def requeue(self, job_id: int) -> Job:
        """Queue a new job with the spec of an ended one."""
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.RequeueRequest(job_id)))

    def array(self, array_id: int) -> list[Job]:
        """The jobs of one sweep array, in order."""
        from gpusched.core.requests import catalog as rq

        return [_job(j) for j in self.send(rq.ArrayRequest(array_id))]

    def cancel_array(self, array_id: int) -> list[Job]:
        from gpusched.core.requests import catalog as rq

        return [_job(j) for j in self.send(rq.CancelRequest(array=array_id))]

    def cancel_mine(self, waiting_only: bool = False) -> list[Job]:
        """Cancel every active job of the caller's (`waiting_only`: those not started yet)."""
        from gpusched.core.requests import catalog as rq

        jobs = self.send(rq.CancelRequest(mine=True, waiting_only=waiting_only))
        return [_job(j) for j in jobs]

    def hold(self, job_id: int) -> Job:
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.HoldRequest(job_id)))

    def release(self, job_id: int) -> Job:
        from gpusched.core.requests import catalog as rq

        return _job(self.send(rq.ReleaseRequest(job_id)))

    def change(
        self, job_ids: Sequence[int], action: str, priority: int | None = None
    ) -> tuple[list[Job], dict[int, str]]:
        """Hold, release (`action`) or set the `priority` of many jobs in one request and
        one scheduling pass: the jobs changed, and why each other was left as it was."""
        from gpusched.core.requests import catalog as rq

        reply = self.send(rq.ChangeRequest(tuple(job_ids), action, priority))
        jobs = [_job(j) for j in reply["jobs"]]
        return jobs, {int(r["id"]): str(r["error"]) for r in reply["refused"]}

    def drain(self, reason: str | None = None, node: str | None = None) -> Drain:
        """Start no new job (administrators only); running jobs go on, the queue waits.
        `node`: that server of the cluster (None: the daemon's own)."""
        from gpusched.core.requests import catalog as rq

        result = self.send(rq.DrainRequest(on=True, reason=reason, node=node))
        from gpusched.core.models import Drain

        return Drain.from_json(result)

    def prune(self, ended_before_s: float, dry_run: bool = False) -> PruneReply:
        """Forget jobs that ended more than `ended_before_s` ago (administrators only): one
        batch per call; {"jobs", "log_bytes", "more", "cutoff"}."""
        from gpusched.core.requests import catalog as rq

        result: PruneReply = self.send(
            rq.PruneRequest(ended_before_s=ended_before_s, dry_run=dry_run)
        )
        return result

    def reload(self) -> list[str]:
        """Have the daemon apply its config file now (administrators only); what it kept
        because it needs a restart. A rejected config raises its error."""
        from gpusched.core.requests import catalog as rq

        result: dict[str, Any] = self.send(rq.ReloadRequest())
        return [str(note) for note in result.get("kept", [])]

    def undrain(self, node: str | None = None) -> None:
        """Let jobs start again (administrators only), on `node` or the daemon's own."""
        from gpusched.core.requests import catalog as rq

        self.send(rq.DrainRequest(on=False, node=node))

    def history(
        self,
        user: str | None = None,
        limit: int = 50,
        states: Sequence[str] | None = None,
        since: str | None = None,
    ) -> list[Job]:
        """Ended jobs, most recent first. `states`: e.g. ["failed", "lost"]; `since`: an
        ISO timestamp with a time zone (jobs that ended at or after it)."""
        from gpusched.core.requests import catalog as rq

        states = None if states is None else tuple(states)
        ask = rq.HistoryRequest(limit=limit, user=user, states=states, since=since)
        return [_job(j) for j in self.send(ask)]

    def logs(self, job_id: int, offset: int = 0) -> LogChunk:
        from gpusched.core.models import LogChunk
        from gpusched.core.requests import catalog as rq

        return LogChunk.from_json(self.send(rq.LogsRequest(job_id, offset)))

    if TYPE_CHECKING:

        @overload
        def wait(self, job_ids: int, timeout: float | None = None) -> Job: ...

        @overload
        def wait(self, job_ids: Sequence[int], timeout: float | None = None) -> list[Job]: ...

    def wait(self, job_ids: int | Sequence[int], timeout: float | None = None) -> Job | list[Job]:
        """Block until the job (one id) or every job (a list) has ended, or `timeout`
        seconds pass; return the Job, or the Jobs in the order asked. After a timeout
        some are still active: check `job.state in TERMINAL_STATES`."""
        if isinstance(job_ids, int):
            return self._wait([job_ids], timeout)[0]
        return self._wait(list(job_ids), timeout)

    def _wait(self, job_ids: list[int], timeout: float | None) -> list[Job]:
        from gpusched.core.models import TERMINAL_STATES
        from gpusched.core.requests import catalog as rq

        deadline = None if timeout is None else time.monotonic() + timeout
        unique = list(dict.fromkeys(job_ids))  # the daemon answers each id once
        while True:
            remaining = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
            found = {
                job["id"]: _job(job)
                for job in self.send(rq.WaitRequest(tuple(unique), min(30.0, remaining)))
            }
            jobs = [found[i] for i in job_ids if i in found]
            if all(job.state in TERMINAL_STATES for job in jobs):
                return jobs
            if deadline is not None and time.monotonic() >= deadline:
                return jobs


def _job(data: Any) -> Job:
    """A reply's job as the model (imported here: only the commands that return one)."""
    from gpusched.core.models import Job

    return Job.from_json(data)
