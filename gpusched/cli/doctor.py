"""`gpusched doctor`: check what usually goes wrong on a new server, and say how to fix it.

Each check returns a `Check` (ok, warn, fail or skip) with a one-line finding and, when
something is wrong, the fix. The checks read; they never change anything. Only this
module imports pynvml outside the daemon, and only when the config does not simulate
GPUs: `doctor` is not on `status`'s import path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpusched.config.settings import (
    SYSTEM_CONFIG_PATH,
    SYSTEM_SOCKET_PATH,
    Config,
    config_path_from_env,
    default_config,
    load_config,
)
from gpusched.core.errors import GpuschedError
from gpusched.core.requests.protocol import VERSION
from gpusched.daemon_socket import resolve_socket, system_service_installed

OK = "ok"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"

SYSTEMCTL_TIMEOUT_S = 5.0
SERVICE = "gpusched"
ADMINISTRATOR = "tell the server's administrator: it is the daemon's, which runs as root"
INSTALL_SERVICE = (
    "install it (docs/operations.md): sudo install -m 0644 systemd/gpusched.service"
    " /etc/systemd/system/gpusched.service && sudo systemctl daemon-reload"
    " && sudo systemctl enable --now gpusched"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Context:
    """What the checks learn from each other (the config, whose daemon answered)."""

    config: Config
    config_path: Path | None
    socket_arg: str | None
    socket_path: Path | None = None
    daemon_uid: int | None = None
    system_config: Path = SYSTEM_CONFIG_PATH  # the system service's (a test names another)

    @property
    def served(self) -> bool:
        """Whether the daemon that answered is another account's (root's, on a shared
        server): its cards, files and service are then its administrator's to check."""
        me = os.geteuid()
        return me != 0 and self.daemon_uid is not None and self.daemon_uid != me


def _config_check(ctx: _Context) -> Check:
    path = ctx.config_path
    whose = ""
    if path is None and ctx.system_config.exists():
        if os.geteuid() == 0:
            path = ctx.system_config
        elif _client_uses_the_system_service(ctx):
            # A user's client talks to the system service: its config is the one to check,
            # not a personal daemon's defaults.
            path, whose = ctx.system_config, " (the system service's: your client uses it)"
    try:
        ctx.config = load_config(path)
    except GpuschedError as exc:
        return Check(
            "config",
            FAIL,
            exc.message,
            "correct the key named above; config/gpusched.yaml documents every key"
            " (the daemon refuses to start with this file)",
        )
    if path is None:
        if os.geteuid() == 0:
            return Check(
                "config",
                WARN,
                f"no {SYSTEM_CONFIG_PATH}: the system service would run on defaults",
                f"copy config/gpusched.yaml to {SYSTEM_CONFIG_PATH} and adjust it",
            )
        return Check("config", OK, "no config file: defaults for a single-user daemon")
    extra = f" (simulate: {ctx.config.simulate})" if ctx.config.simulate else ""
    return Check("config", OK, f"{path} is valid{whose}{extra}")


def _client_uses_the_system_service(ctx: _Context) -> bool:
    """Whether this user's client, given no socket, goes to the system service: one is
    installed (the client then never prefers a personal daemon: gpusched.daemon_socket)."""
    if ctx.socket_arg or os.environ.get("GPUSCHED_SOCKET"):
        return False
    return system_service_installed()


def _gpus_check(ctx: _Context) -> Check:
    if ctx.config.simulate:
        return Check("gpus", OK, f"simulated GPUs ({ctx.config.simulate}): NVML is not used")
    try:
        from gpusched.gpus.nvml import NvmlProbe
    except ImportError as exc:
        return Check(
            "gpus",
            FAIL,
            f"cannot import pynvml: {exc}",
            "pip install nvidia-ml-py (it provides pynvml), in gpusched's environment",
        )
    probe = NvmlProbe()
    try:
        gpus = probe.snapshot()
        described = probe.describe()
    except GpuschedError as exc:
        # The probe's message already names the cause and the fix.
        return Check("gpus", FAIL, exc.message)
    finally:
        probe.close()
    if not gpus:
        return Check("gpus", FAIL, "NVML lists no GPUs", "check `nvidia-smi -L`")
    lost = [g for g in gpus if g.health != "ok"]
    cards = ", ".join(f"{g.index}: {g.name}" for g in gpus)
    if lost:
        return Check(
            "gpus",
            WARN,
            f"{described}; unreadable: "
            + ", ".join(f"GPU {g.index} ({g.error or g.health})" for g in lost),
            "check `nvidia-smi` and the kernel log (dmesg) for those GPUs",
        )
    return Check("gpus", OK, f"{described} ({cards})")


def _served_gpus_check(ctx: _Context) -> Check:
    """The GPUs the daemon schedules, as it reads them: what a user's jobs get."""
    from gpusched.client import Client

    gpus = Client(ctx.socket_path).status_reply(states=["running"], first=1)["gpus"]
    if not gpus:
        return Check("gpus", FAIL, "the daemon reads no GPUs", ADMINISTRATOR)
    cards = ", ".join(f"{g['index']}: {g['name']}" for g in gpus)
    message = f"the daemon reads {len(gpus)} GPU(s) ({cards})"
    lost = [g for g in gpus if g.get("state") != "ok"]
    if lost:
        unreadable = ", ".join(f"GPU {g['index']} ({g.get('error') or g['state']})" for g in lost)
        return Check("gpus", WARN, f"{message}; unreadable: {unreadable}", ADMINISTRATOR)
    return Check("gpus", OK, message)


def _devices_check(ctx: _Context) -> Check:
    """Whether a job is kept off the cards it was not given (gpusched.processes.devices)."""
    if ctx.config.simulate:
        return Check("devices", SKIP, "simulated GPUs have no device nodes: nothing to fence")
    from gpusched.processes import devices

    on_v2 = devices.own_v2_cgroup() is not None
    if os.geteuid() != 0 and on_v2 and devices.own_devices_cgroup() is None:
        # There the answer is whether a BPF device program loads: only root can try.
        return Check(
            "devices",
            SKIP,
            "cgroup v2: whether BPF device programs fence the cards only root can check"
            " (the daemon says so at its start)",
        )
    why = devices.fencing_unavailable()
    if why is not None:
        return Check(
            "devices",
            WARN,
            f"{why}: a job that ignores CUDA_VISIBLE_DEVICES can open every card",
            "run the daemon as root on cgroup v1's devices controller, or on cgroup v2"
            " where BPF device programs load (docs/operations.md, Security model)",
        )
    return Check("devices", OK, f"{devices.fenced_by()}: each job can open only its own GPUs")


def _host_check() -> Check:
    """Whether a job's `--ram` and `--cpus` would be held here (gpusched.processes.cgroups,
    .cpusets), as a root daemon started here would find it."""
    from gpusched.processes.cgroups import own_memory_cgroup
    from gpusched.processes.cpusets import unavailable

    missing = [why for why in (unavailable(),) if why]
    if own_memory_cgroup() is None:
        missing.insert(0, "no memory cgroup to cap a job's host memory")
    if os.geteuid() != 0:
        missing.insert(0, "not root: only a root daemon gives jobs cgroups of their own")
    if missing:
        return Check(
            "host",
            WARN,
            f"{'; '.join(missing)}: --ram and --cpus are refused at submit",
            "run the daemon as root, as the unit does (docs/operations.md, Host memory and cores)",
        )
    return Check(
        "host",
        OK,
        "memory and cpuset cgroups: a root daemon in a cgroup of its own (the unit's) holds"
        " a job to its --ram and --cpus",
    )


def _daemon_check(ctx: _Context) -> Check:
    from gpusched.client import Client

    try:
        path, _ = resolve_socket(ctx.socket_arg, ctx.config_path)
    except GpuschedError:
        path = ctx.config.socket_path  # the config is broken; its own check said so
    ctx.socket_path = path
    try:
        info = Client(path).ping()
    except GpuschedError as exc:
        if path.exists() and not path.is_socket():
            fix = f"{path} is not a socket: remove it, then start the daemon"
        elif path.exists():
            fix = (
                "a daemon left this socket behind and no longer listens:"
                " sudo systemctl restart gpusched (or start `gpusched daemon` again)"
            )
        else:
            fix = (
                "start it: sudo systemctl start gpusched (system service), or"
                " `gpusched daemon` for yourself; `journalctl -u gpusched` says why it stopped"
            )
        if os.geteuid() != 0 and path == SYSTEM_SOCKET_PATH:
            fix = (
                "the system service does not answer: tell the server's administrator"
                " (`systemctl status gpusched` says why)"
            )
        return Check("daemon", FAIL, exc.message, fix)
    ctx.daemon_uid = info.get("daemon_uid")
    owner = info.get("daemon_user") or f"uid {ctx.daemon_uid}"
    serves = "every user" if ctx.daemon_uid == 0 else f"only {owner}"
    message = (
        f"daemon pid {info.get('pid')} (version {info.get('version')}) answers at {path},"
        f" running as {owner}: serves {serves}"
    )
    restart = "restart the daemon after an upgrade: sudo systemctl restart gpusched"
    if ctx.served:
        restart = f"tell the server's administrator to {restart}"
    if info.get("version") != VERSION:
        return Check("daemon", WARN, f"{message}; this gpusched is {VERSION}", restart)
    started, changed = info.get("started"), code_changed_at()
    if isinstance(started, (int, float)) and changed > started:
        return Check(
            "daemon",
            WARN,
            f"{message}; it started before gpusched's files here were last changed"
            f" ({time.strftime('%Y-%m-%d %H:%M', time.localtime(changed))}): it runs older code",
            restart,
        )
    return Check("daemon", OK, message)


def code_changed_at() -> float:
    """When the installed gpusched's Python files were last written (an upgrade, an edit)."""
    package = Path(__file__).resolve().parent.parent
    return max((path.stat().st_mtime for path in package.rglob("*.py")), default=0.0)


def _writable_check(name: str, path: Path, ctx: _Context) -> Check:
    me = os.geteuid()
    daemon_uid = ctx.daemon_uid
    if daemon_uid is None:
        daemon_uid = 0 if ctx.config.socket_path == SYSTEM_SOCKET_PATH else me
    if ctx.served:
        return Check(name, SKIP, f"{path}: the daemon's (it runs as root), not yours to check")
    if me not in (0, daemon_uid):
        return Check(name, SKIP, f"{path}: the daemon runs as root", "run `sudo gpusched doctor`")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return Check(name, FAIL, f"{existing} is not a directory", f"remove it or move {name}")
    if not os.access(existing, os.W_OK | os.X_OK):
        return Check(
            name,
            FAIL,
            f"{existing} is not writable by uid {me}",
            f"fix its owner or mode, or point `{name}:` in the config elsewhere",
        )
    if existing != path:
        return Check(name, OK, f"{path} does not exist yet; the daemon will create it")
    return Check(name, OK, f"{path} is writable")


def _database_check(ctx: _Context) -> Check:
    url = ctx.config.database_url
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return Check("database", SKIP, f"{url.split('://')[0]} database: not checked here")
    return _writable_check("database", Path(url.removeprefix("sqlite:///")).parent, ctx)


SERVED_DEVICES = Check("devices", SKIP, "the daemon's to fence, checked by its administrator")
SERVED_HOST = Check("host", SKIP, "the daemon's cgroups, checked by its administrator")
SERVED_SYSTEMD = Check("systemd", SKIP, "the service is its administrator's; its daemon answers")


def _systemctl(*args: str) -> tuple[int, str]:
    try:
        done = subprocess.run(
            ["systemctl", *args],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, (done.stdout.strip() or done.stderr.strip())


def _systemd_check(ctx: _Context) -> Check:
    if shutil.which("systemctl") is None:
        return Check("systemd", SKIP, "no systemctl: not a systemd system")
    if not Path("/run/systemd/system").is_dir():
        return Check("systemd", SKIP, "systemd is not running here (a container?)")
    # The service matters when this is (or should be) the system daemon.
    system = ctx.socket_path == SYSTEM_SOCKET_PATH
    missing = FAIL if system else WARN
    code, state = _systemctl("is-active", SERVICE)
    if code == 0:
        _, enabled = _systemctl("is-enabled", SERVICE)
        if enabled != "enabled":
            return Check(
                "systemd",
                WARN,
                f"{SERVICE}.service is active but {enabled or 'not enabled'}: not started at boot",
                "sudo systemctl enable gpusched",
            )
        return Check("systemd", OK, f"{SERVICE}.service is active and enabled")
    _, enabled = _systemctl("is-enabled", SERVICE)
    if "not-found" in enabled or "No such file" in enabled:
        return Check("systemd", missing, f"{SERVICE}.service is not installed", INSTALL_SERVICE)
    return Check(
        "systemd",
        missing,
        f"{SERVICE}.service is {state or 'not active'}",
        "sudo systemctl start gpusched; `journalctl -u gpusched -n 50` says why it stopped",
    )


def run_checks(
    config_path: str | None = None,
    socket_path: str | None = None,
    *,
    system_config: Path = SYSTEM_CONFIG_PATH,
) -> list[Check]:
    """Every check, in the order a new server needs them. `system_config`: where the
    system service's config is (tests name another file)."""
    ctx = _Context(default_config(), config_path_from_env(config_path), socket_path)
    ctx.system_config = system_config
    steps: list[Callable[[], Check]] = [
        lambda: _config_check(ctx),
        lambda: _daemon_check(ctx),  # before the cards: whose daemon decides what to check
        lambda: _served_gpus_check(ctx) if ctx.served else _gpus_check(ctx),
        lambda: SERVED_DEVICES if ctx.served else _devices_check(ctx),
        lambda: SERVED_HOST if ctx.served else _host_check(),
        lambda: _writable_check("state_dir", ctx.config.state_dir, ctx),
        lambda: _writable_check("log_dir", ctx.config.log_dir, ctx),
        lambda: _database_check(ctx),
        lambda: SERVED_SYSTEMD if ctx.served else _systemd_check(ctx),
    ]
    checks = []
    for step in steps:
        try:
            checks.append(step())
        except Exception as exc:  # a check that breaks is itself a finding, not a crash
            checks.append(Check("doctor", FAIL, f"a check failed: {type(exc).__name__}: {exc}"))
    return checks


_LABELS = {
    OK: ("ok", "green"),
    WARN: ("warn", "yellow"),
    FAIL: ("FAIL", "red"),
    SKIP: ("skip", None),
}


def render_checks(checks: list[Check], color: bool = False) -> str:
    import click

    from gpusched.core.sanitize import shown as escaped

    width = max(len(c.name) for c in checks) + 2
    lines = []
    for check in checks:
        label, fg = _LABELS.get(check.status, (check.status, None))
        shown = f"{label:<5}"
        if color and fg:
            shown = click.style(shown, fg=fg, bold=check.status == FAIL)
        # Messages quote paths, config values and the daemon's replies: shown escaped.
        lines.append(f"{shown} {check.name:<{width}}{escaped(check.message)}")
        if check.fix and check.status in (FAIL, WARN, SKIP):
            lines.append(f"{'':<6}{'':<{width}}fix: {escaped(check.fix)}")
    failed = sum(1 for c in checks if c.status == FAIL)
    lines.append("")
    lines.append(f"{failed} check(s) failed" if failed else "all checks passed")
    return "\n".join(lines)
