"""The daemon process: wires config, store, probe, launcher, scheduler and server.

It also owns the process-level concerns: logging to stderr, the APScheduler interval job
that drives `tick()`, immediate wake-ups, signals and systemd's sd_notify (the set-up
before serving, and sd_notify itself, are process_setup.py's).

Signals only set flags or wake the main thread; the main thread acts. SIGTERM and
SIGINT stop scheduling and close the database; running jobs keep running (each
under its own supervisor, in its own session) and are re-adopted by the next start.
SIGHUP reloads the configuration file; a bad new file is logged and the old one kept
(`gpusched admin reload` does the same and answers with the error: systemd's ExecReload).

The daemon raises its open-file soft limit to the hard limit (each running job holds a
pidfd, each client a socket). Its listeners run in threads; should one end (its socket
broke: see listening.py), the daemon stops and exits 1, so that systemd restarts it
rather than keep a process that is "active" and deaf.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from gpusched.config.holder import ConfigHolder
from gpusched.config.settings import Config, load_config
from gpusched.core.errors import ConfigError, GpuschedError
from gpusched.daemon.database_url import check_password_private
from gpusched.daemon.hooks import HookRunner
from gpusched.daemon.httpserve import HttpServer, Route
from gpusched.daemon.log_share import TICK_S, LogShares
from gpusched.daemon.process_setup import (
    earlier_run,
    os_failure,
    prepare_dirs,
    raise_open_file_limit,
    sd_notify,
)
from gpusched.daemon.retention import RetentionPass
from gpusched.daemon.server import Server
from gpusched.daemon.services import Services
from gpusched.gpus.probe import Probe, SimulatedProbe
from gpusched.processes.launcher import Launcher
from gpusched.scheduling.cluster.clock import ClusterClock
from gpusched.scheduling.cluster.node import ClusterNode, Identity
from gpusched.scheduling.context import Context, SystemClock
from gpusched.scheduling.ownership import LocalNode
from gpusched.scheduling.ratelog import RateLimitedLog
from gpusched.scheduling.scheduler import Scheduler
from gpusched.store import Store
from gpusched.store.damage import check_file, sqlite_path

log = logging.getLogger("gpusched.daemon")

TICK_JOB_ID = "tick"
RETENTION_JOB_ID = "retention"  # gpusched.daemon.retention, every retention.every
LOG_SHARE_JOB_ID = "log_share"  # gpusched.daemon.log_share, every TICK_S


def run_sooner(ticks: BaseScheduler, job_id: str, when: datetime) -> bool:
    """Move the next run of `job_id` to `when` if that is sooner; True if it moved (the
    interval goes on from there)."""
    job = ticks.get_job(job_id)
    due = None if job is None else job.next_run_time
    if due is None or due <= when:
        return False
    ticks.modify_job(job_id, next_run_time=when)
    return True


def make_probe(config: Config) -> Probe:
    if config.simulate:
        return SimulatedProbe.from_spec(config.simulate, config.simulate_util)
    from gpusched.gpus.nvml import NvmlProbe

    return NvmlProbe()


def node_name(config: Config) -> str:
    """This server's name among the cluster's nodes: `node:`, or its short host name."""
    return config.node or socket.gethostname().split(".")[0]


def in_cluster(config: Config) -> bool:
    """Whether this daemon shares its queue with others: a `node:` name is set, or the
    database is a server's (PostgreSQL). Otherwise it is the one server of today."""
    return config.node is not None or not config.database_url.startswith("sqlite")


class Daemon:
    """Builds every part at construction (failing early with a clear message), runs on run()."""

    def __init__(self, config: Config, config_path: Path | None, overrides: dict[str, str]) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        log.info(
            "gpusched daemon starting (pid %s, %s)",
            os.getpid(),
            "system mode" if os.geteuid() == 0 else "single-user mode",
        )
        raise_open_file_limit()
        self.probe = make_probe(config)
        # Fail now, with the driver's message, not at the first tick.
        gpu_count = len(self.probe.snapshot())
        log.info("GPUs: %s", self.probe.describe())
        prepare_dirs(config)
        database_file = sqlite_path(config.database_url)
        if database_file is not None:  # damaged, or empty after an earlier run: refused
            check_file(database_file, earlier_run(config))
        try:
            # A write waits its turn at most as long as its request may take to arrive.
            self.store = Store(
                config.database_url,
                keep_room=True,
                write_wait_s=config.client_request_timeout_s,
            )
        except OSError as exc:  # its directory or file cannot be made: an SQLite file's
            raise ConfigError(
                f"database {config.database_url}: cannot create it: {os_failure(exc, '')}"
            ) from None
        log.info("database %s, socket %s", self.store.where, config.socket_path)
        # The one holder of the config: a reload replaces it once and reaches every reader.
        self.settings = ConfigHolder(config)
        self.launcher = Launcher(self.settings, gpu_count)
        # What the scheduler calls back (the tick loop's wake-up, the hook runner) is built
        # before it, so that every part of it is complete once built.
        self._ticks = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(3)}, timezone=timezone.utc
        )
        self.hooks = HookRunner(self.store.jobs, lambda: self.config)
        self.log_shares = LogShares(self.settings, self.store.database)
        context = Context.build(
            self.settings,
            self.store,
            self.probe,
            self.launcher,
            # In a cluster, timestamps on the database's clock (scheduling.cluster.clock).
            clock=ClusterClock(SystemClock()) if in_cluster(config) else None,
            wake=self.wake,
            wake_in=self.wake_in,
            end_listeners=[self.hooks.job_ended, self.log_shares.job_ended],
        )
        self.node = node_name(config)
        node: LocalNode | ClusterNode = LocalNode(self.node)
        if in_cluster(config):
            node = ClusterNode(self.node, Identity.of_this_process(), context.clock, self.settings)
        self.scheduler = Scheduler(context, node)
        self.scheduler.placer.join()  # in a cluster, a name held by a live daemon: refused
        self.http: list[HttpServer] = []  # the metrics and web ports, when configured
        # Whose daemon this is: root's serves everyone, a user's serves only that user.
        self._reload_lock = threading.Lock()
        # One retention pass: the periodic one and `admin prune`'s.
        self.retention = RetentionPass(
            self.settings, self.store.database, self.store.jobs, self.launcher
        )
        self.services = Services(
            self.scheduler,
            self.store,
            self.settings,
            owner_uid=os.geteuid(),
            reload_config=self.reload_config,
            retention=self.retention,
        )
        self.server = Server(self.services, config.socket_path)
        self.reload_requested = False
        self.stop_requested = threading.Event()
        self._soon_lock = threading.Lock()
        self._soon: datetime | None = None  # a tick asked for by then (wake_in)
        self._listeners: dict[str, threading.Thread] = {}  # name -> thread: must not end
        self._trouble = RateLimitedLog(log)

    def wake(self) -> None:
        """Run a tick now.

        A tick may be running: max_instances=2 lets one more wait behind it, and the
        scheduler's lock serialises them, so a wake-up that arrives during a tick is
        never lost (with max_instances=1 APScheduler would skip it until the next poll).
        """
        with contextlib.suppress(Exception):
            self._ticks.modify_job(TICK_JOB_ID, next_run_time=datetime.now(timezone.utc))

    def wake_in(self, seconds: float) -> None:
        """Run a tick within `seconds`, unless one is due sooner (a job just started is
        polled while it allocates: scheduling.starting). Noted here, moved by the main
        loop within half a second: a pass asks for it, and a pass must not call into
        APScheduler, whose shutdown holds its job stores' lock while it waits for the
        running pass (the stop would wait for ever)."""
        due = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        with self._soon_lock:
            if self._soon is None or due < self._soon:
                self._soon = due

    def _apply_soon(self) -> None:
        with self._soon_lock:
            due, self._soon = self._soon, None
        if due is not None:
            with contextlib.suppress(Exception):
                run_sooner(self._ticks, TICK_JOB_ID, due)

    def _add_retention_jobs(self) -> None:
        """The retention pass, and the checks of each user's share of log_dir."""
        self._ticks.add_job(
            self._guarded(self.retention.retention_pass),
            "interval",
            seconds=self.config.retention.every_s,
            id=RETENTION_JOB_ID,
            max_instances=1,
            coalesce=True,
        )
        self._ticks.add_job(
            self._guarded(self.log_shares.tick),
            "interval",
            seconds=TICK_S,
            id=LOG_SHARE_JOB_ID,
            max_instances=1,
            coalesce=True,
        )

    def _guarded(self, work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except Exception as exc:  # the database away: said once a minute, tried again
                self._trouble.warning(f"{work.__name__}", f"{work.__name__} failed: {exc!r}")

        return run

    def _tick(self) -> None:
        try:
            self.store.check_space()  # a full disk: room for ends, submits refused
            self.scheduler.tick()
        except Exception as exc:  # one bad tick must not end the loop; the next one retries
            # A pass that fails every poll the same way (out of open files: EMFILE) is said
            # once a minute, with its traceback, not every two seconds.
            key = f"tick: {type(exc).__name__} {getattr(exc, 'errno', '')}"
            self._trouble.warning(key, f"scheduling pass failed: {exc!r}", exc_info=True)

    def _take_over(self) -> None:
        """Start the zygote and adopt the running jobs, unless another daemon answers:
        one started by mistake beside a live one must leave its jobs and zygote be."""
        self.server.refuse_if_answered()
        self.launcher.protect()  # before the zygote: it and the supervisors inherit it
        # Warm up the supervisor zygote while we re-adopt jobs and bind the socket.
        self.scheduler.context.launcher.start_zygote()
        # Before adoption, which may end jobs and queue their hooks: none is queued twice.
        self.hooks.resume()
        self.scheduler.adopt_running()
        self.scheduler.placer.reconcile_at_start(self.launcher.job_ids)

    def run(self) -> int:
        self._take_over()
        if self.scheduler.drain is not None:
            log.warning(
                "%s: no new job starts until `gpusched undrain`", self.scheduler.drain.describe()
            )
        self._bind()
        try:
            self._start_http()
        except GpuschedError:
            self._close_http()
            self.server.close()  # a busy port stops the daemon: leave no socket behind
            raise
        self._ticks.add_job(
            self._tick,
            "interval",
            seconds=self.config.poll_interval_s,
            id=TICK_JOB_ID,
            max_instances=2,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(timezone.utc),
        )
        self._add_retention_jobs()
        placer = self.scheduler.placer
        if placer.poll_every_s is not None:  # placements and cancels from elsewhere, at once
            self._ticks.add_job(
                self._guarded(placer.poll),
                "interval",
                seconds=placer.poll_every_s,
                id="cluster-poll",
                max_instances=1,
                coalesce=True,
            )
        self._ticks.start()
        # Before the socket answers: a SIGTERM sent as soon as it does (a restart right after
        # a start) must stop the daemon cleanly, its socket removed, not kill it.
        self._install_signals()
        self._listen("socket", self.server.serve_forever)
        for http in self.http:
            self._listen(http.name, http.serve_forever)
        sd_notify("READY=1\nSTATUS=scheduling")
        log.info("ready: listening on %s", self.config.socket_path)
        status = 0
        while not self.stop_requested.wait(0.5):
            self._apply_soon()
            if self.reload_requested:
                self.reload_requested = False
                self._reload()
            dead = [name for name, thread in self._listeners.items() if not thread.is_alive()]
            if dead:
                log.critical("the %s listener ended: exiting for a restart", dead[0])
                status = 1
                break
        sd_notify("STOPPING=1")
        log.info("stopping: running jobs keep running and will be re-adopted at the next start")
        self.server.close()
        self._ticks.shutdown(wait=True)
        try:  # after the last pass: nothing adds a point any more
            self.scheduler.context.monitor.flush_all()
        except Exception as exc:  # the database away: the points are lost, the stop goes on
            log.warning("could not write the running jobs' last usage points: %r", exc)
        self.scheduler.context.launcher.close()
        self.hooks.close()
        self._close_http()
        self.scheduler.placer.leave()
        self.store.close()
        self.probe.close()
        return status

    def _bind(self) -> None:
        """Listen on the socket, or raise ConfigError naming it: its directory cannot be
        made, its path is too long for a Unix socket..."""
        try:
            self.server.bind()
        except OSError as exc:
            path = self.config.socket_path
            raise ConfigError(
                f"socket {path}: cannot listen there: {os_failure(exc, path)}"
            ) from None

    def _start_http(self) -> None:
        """The metrics and web ports: one server for both when they name one address."""
        wanted: dict[tuple[str, int], tuple[list[str], dict[str, Route]]] = {}
        if self.config.metrics_address is not None:
            from gpusched.daemon.metrics import metrics_routes  # prometheus_client only if asked

            names, routes = wanted.setdefault(self.config.metrics_address, ([], {}))
            names.append("metrics")
            routes.update(metrics_routes(self.scheduler, self.config.metrics_address[0]))
        if self.config.web_address is not None:
            from gpusched.daemon.web.site import web_routes

            names, routes = wanted.setdefault(self.config.web_address, ([], {}))
            names.append("web")
            if self.services.single_user:
                log.warning(
                    "web: this daemon serves only its user, but its dashboard shows that"
                    " user's jobs (commands hidden) to anyone who can reach %s:%s",
                    *self.config.web_address,
                )
            routes.update(web_routes(self.services, self.config.web_address[0]))
        for address, (names, routes) in wanted.items():
            self.http.append(
                HttpServer.start(
                    names,
                    address,
                    routes,
                    lambda: self.settings.current.client_request_timeout_s,
                    self.config.metrics_scraper if "metrics" in names else None,
                )
            )

    def _close_http(self) -> None:
        for http in self.http:
            http.close()

    def _listen(self, name: str, serve_forever: Callable[[], None]) -> None:
        thread = threading.Thread(target=serve_forever, name=name, daemon=True)
        thread.start()
        self._listeners[name] = thread

    def _install_signals(self) -> None:
        def stop(_signum: int, _frame: object) -> None:
            self.stop_requested.set()

        def reload(_signum: int, _frame: object) -> None:
            self.reload_requested = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def _reload(self) -> None:
        """SIGHUP: reload, or keep the old config (reload_config logs why)."""
        with contextlib.suppress(GpuschedError):
            self.reload_config()

    def reload_config(self) -> list[str]:
        """Read the config file again and apply it (`gpusched admin reload`, SIGHUP); what
        was kept because it needs a restart. A bad file raises its ConfigError, the old
        config staying in force."""
        with self._reload_lock:  # a request and a SIGHUP at once apply one after the other
            try:
                return self._apply_reload()
            except GpuschedError as exc:  # said in the journal too, whoever asked
                log.error("config reload failed, keeping the old config: %s", exc.message)
                raise

    def _apply_reload(self) -> list[str]:
        new = load_config(self.config_path, self.overrides)
        fixed = (
            "socket_path",
            "database_url",
            "state_dir",
            "log_dir",
            "simulate",
            "simulate_util",
            "metrics_address",
            "web_address",
            "node",
            "node_timeout_s",
        )
        changed = [name for name in fixed if getattr(new, name) != getattr(self.config, name)]
        if changed:
            log.warning("config reload: %s need a restart to change; kept", ", ".join(changed))
            new = replace(new, **{name: getattr(self.config, name) for name in changed})
        self.config = new
        self.settings.replace(new)  # the scheduler, launcher and request handlers read it
        self._ticks.reschedule_job(TICK_JOB_ID, trigger="interval", seconds=new.poll_interval_s)
        self._ticks.reschedule_job(
            RETENTION_JOB_ID, trigger="interval", seconds=new.retention.every_s
        )
        log.info("config reloaded from %s", self.config_path or "defaults")
        self.wake()
        return [f"{name} needs a restart to change: kept" for name in changed]


def run_daemon(config_path: Path | None, simulate: str | None, socket: str | None = None) -> int:
    from gpusched.daemon.logfmt import log_handler

    # One record per line, users' strings escaped: a newline in a command forges nothing.
    logging.basicConfig(level=logging.INFO, handlers=[log_handler()])
    # APScheduler warns each time a wake-up finds a tick running and one already waiting
    # ("maximum number of running instances reached"); that is the design, not a problem.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    overrides = {"simulate": simulate} if simulate else {}
    if socket:  # `gpusched daemon --socket PATH` (or $GPUSCHED_SOCKET) listens there
        # Relative to the shell's directory, as a client given the same path reads it; the
        # config's own paths must be absolute.
        overrides["socket"] = os.path.abspath(socket)
    config = load_config(config_path, overrides)
    source = None if config.source in (None, "defaults") else Path(str(config.source))
    check_password_private(config.database_url, source)
    return Daemon(config, config_path, overrides).run()
