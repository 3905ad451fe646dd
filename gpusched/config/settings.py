"""Configuration: YAML file -> frozen `Config`, with defaults, validation and discovery
(of the config file; a client's choice of daemon socket is gpusched/daemon_socket.py).

Every key is optional. Defaults depend on who runs the daemon: as root, system paths
under /run, /var/lib and /var/log; as anyone else, paths in the user's own runtime and
state directories, so gpusched can be tried on a laptop without installing anything.
Sizes are bytes and durations are seconds inside `Config` (units in the names).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gpusched.config.host import HostSettings, parse_host
from gpusched.config.interactive import InteractiveSettings, parse_interactive
from gpusched.config.paths import (
    SYSTEM_CONFIG_PATH,
    SYSTEM_SOCKET_PATH,
    config_path_from_env,  # noqa: F401  (doctor imports it from here)
    user_socket_path,
)
from gpusched.config.paths import user_state_dir as _user_state_dir
from gpusched.config.retention import RetentionSettings, parse_retention
from gpusched.config.values import (
    one_of,
    parse_address,
    parse_admins,
    parse_bool,
    parse_command,
    parse_count_bound,
    parse_database_url,
    parse_duration_or_zero,
    parse_gpus,
    parse_hook_count,
    parse_ip,
    parse_log_cap,
    parse_margin,
    parse_node_name,
    parse_node_timeout,
    parse_path,
    parse_percent,
    parse_positive_or_null,
    parse_simulate,
    parse_simulate_util,
    parse_size_bound,
    parse_size_or_zero,
    parse_web_address,
)
from gpusched.core.errors import ConfigError, UsageError
from gpusched.core.units import LIGHT_UTIL, parse_duration, parse_size


def _is_root() -> bool:
    return os.geteuid() == 0


DEFAULT_MAX_QUEUED = 10_000  # limits.default.max_queued: waiting jobs per user


@dataclass(frozen=True)
class UserLimits:
    """Per-user limits (None: unlimited). `max_mem_bytes` sums declared memory over GPUs;
    `host_mem_bytes` caps each job's host memory (None: its share of the service's,
    gpusched.processes.launcher)."""

    max_running: int | None = None
    max_mem_bytes: int | None = None
    max_queued: int | None = DEFAULT_MAX_QUEUED
    host_mem_bytes: int | None = None

    def over(self, other: UserLimits) -> UserLimits:
        """These limits, with every key `other` sets taking precedence."""
        return UserLimits(
            *(
                theirs if theirs is not None else mine
                for mine, theirs in zip(astuple(self), astuple(other), strict=True)
            )
        )


@dataclass(frozen=True)
class Config:
    socket_path: Path
    database_url: str
    state_dir: Path
    log_dir: Path
    poll_interval_s: float = 2.0
    headroom_bytes: int = 512 * 2**20
    gpus: tuple[int | str, ...] | None = None  # None = all
    simulate: str | None = None
    simulate_util: int = LIGHT_UTIL  # percent a simulated job keeps its card busy
    max_jobs_per_gpu: int | None = None
    busy_util: float | None = None  # percent; a GPU this busy takes no new job (None: off)
    placement: str = "most-free"  # or "best-fit": the policy's rule 5
    pack: str = "contention"  # or "memory": the policy's rule 3 (busy jobs apart) off
    visible_devices: str = "index"  # or "uuid"
    overrun: str = "warn"  # or "kill": a job over its declared memory + margin is stopped
    overrun_margin_fraction: float = 0.10  # of the declared memory (overrun_margin: 10%)
    overrun_margin_bytes: int = 0  # or a size (overrun_margin: 1G)
    hint_min_runtime_s: float = 120.0  # shorter jobs get no size/utilization hints
    kill_grace_s: float = 10.0
    max_log_bytes: int | None = 2**30  # each job's log (max_log_size); None: unlimited
    fair_share_half_life_s: float = 3600.0
    show_commands: bool = False
    admins: tuple[str, ...] = ()
    on_finish: tuple[str, ...] | None = None  # argv run as each job's owner when it ends
    hook_timeout_s: float = 30.0
    hooks_per_user: int = 2  # one user's hooks running at once; more wait their turn
    hooks_total: int = 8  # hooks running at once, all users together
    hook_output_max_bytes: int = 64 * 2**10  # a hook's output kept; at the limit, cut
    metrics_address: tuple[str, int] | None = None  # (host, port) for Prometheus; None: off
    web_address: tuple[str, int] | None = None  # (host, port) of the dashboard; None: off
    metrics_scraper: str | None = None  # an IP address: one metrics slot kept for it
    # Every listener's clients (listening.py): idle time allowed between requests, and the
    # whole time one request may take to arrive however it trickles in (slowloris).
    client_idle_timeout_s: float = 60.0
    client_request_timeout_s: float = 30.0
    # Request bounds: what one request may make the daemon build or store. Each is a config
    # key of the same name; docs/operations.md lists them with the rest.
    max_array_jobs: int = 10_000  # jobs one --sweep creates
    max_submit_bytes: int = 16 * 2**20  # argv+names+after, all jobs
    max_job_bytes: int = 128 * 2**10  # one job's argv and after
    max_env_bytes: int = 256 * 2**10  # a submit's environment
    status_page_jobs: int = 1000  # jobs per `status` reply
    default_limits: UserLimits = UserLimits()
    user_limits: Mapping[str, UserLimits] = field(default_factory=dict)
    # The cluster (docs/cluster.md): this server's name in a shared database (None: not
    # set, one server; the daemon then names itself after its short host name), and how
    # long a node may go unheard before the others declare it down.
    node: str | None = None
    node_timeout_s: float = 30.0
    interactive: InteractiveSettings = field(default_factory=InteractiveSettings)  # run, claim()
    retention: RetentionSettings = field(default_factory=RetentionSettings)  # what is kept
    host: HostSettings = field(default_factory=HostSettings)  # --ram and --cpus (config.host)
    source: str | None = None  # the file this came from, for messages

    def limits_for(self, user: str) -> UserLimits:
        override = self.user_limits.get(user)
        return self.default_limits if override is None else self.default_limits.over(override)


def default_config() -> Config:
    if _is_root():
        return Config(
            socket_path=SYSTEM_SOCKET_PATH,
            database_url="sqlite:////var/lib/gpusched/gpusched.db",
            state_dir=Path("/var/lib/gpusched"),
            log_dir=Path("/var/log/gpusched/jobs"),
        )
    state = _user_state_dir()
    return Config(
        socket_path=user_socket_path(),
        database_url=f"sqlite:///{state / 'gpusched.db'}",
        state_dir=state,
        log_dir=state / "jobs",
    )


_LIMIT_KEYS = {"max_running", "max_mem", "max_queued", "host_mem"}


def _one_limit(where: str, value: Any) -> UserLimits:
    """`default` (a key left out takes the built-in default; null: unlimited) or one
    user's overrides (a key left out or null takes `default`'s)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise UsageError(f"{where}: expected a mapping with {', '.join(sorted(_LIMIT_KEYS))}")
    unknown = set(value) - _LIMIT_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown limit {sorted(unknown)[0]!r}")
    counts: dict[str, int | None] = {}
    for name in ("max_running", "max_queued"):
        count = value.get(name)
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or count < 0
        ):
            raise UsageError(f"{where}.{name}: expected a whole number >= 0")
        counts[name] = count
    mem = value.get("max_mem")
    host_mem = None if value.get("host_mem") is None else parse_size(value["host_mem"])
    return UserLimits(
        max_running=counts["max_running"],
        max_mem_bytes=None if mem is None else parse_size(mem),
        max_queued=(
            DEFAULT_MAX_QUEUED
            if where == "default" and "max_queued" not in value
            else counts["max_queued"]
        ),
        host_mem_bytes=host_mem,
    )


def _limits(value: Any) -> dict[str, Any]:
    """`limits: {default: {...}, users: {alice: {...}}}` -> default and per-user limits."""
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"default", "users"}:
        raise UsageError("expected a mapping with 'default' and/or 'users'")
    users = value.get("users") or {}
    if not isinstance(users, dict):
        raise UsageError("'users' must map user names to limits")
    return {
        "default_limits": _one_limit("default", value.get("default")),
        "user_limits": {str(name): _one_limit(f"users.{name}", lim) for name, lim in users.items()},
    }


# Each YAML key: the Config field it sets and the parser of its value (most in values.py).
# A field of None: the key sets more than one field, and its parser returns them by name.
_KEYS: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "socket": ("socket_path", parse_path),
    "database": ("database_url", parse_database_url),
    "state_dir": ("state_dir", parse_path),
    "log_dir": ("log_dir", parse_path),
    "poll_interval": ("poll_interval_s", parse_duration),
    "kill_grace": ("kill_grace_s", parse_duration),
    "max_log_size": ("max_log_bytes", parse_log_cap),
    "fair_share_half_life": ("fair_share_half_life_s", parse_duration),
    "headroom": ("headroom_bytes", parse_size_or_zero),
    "gpus": ("gpus", parse_gpus),
    "simulate": ("simulate", parse_simulate),
    "simulate_util": ("simulate_util", parse_simulate_util),
    "max_jobs_per_gpu": ("max_jobs_per_gpu", parse_positive_or_null),
    "busy_util": ("busy_util", parse_percent),
    "placement": ("placement", one_of("most-free", "best-fit")),
    "pack": ("pack", one_of("contention", "memory")),
    "visible_devices": ("visible_devices", one_of("index", "uuid")),
    "overrun": ("overrun", one_of("warn", "kill")),
    "overrun_margin": (None, parse_margin),  # a fraction or a size
    "hint_min_runtime": ("hint_min_runtime_s", parse_duration_or_zero),
    "show_commands": ("show_commands", parse_bool),
    "limits": (None, _limits),  # the default limits and each user's
    "interactive": ("interactive", parse_interactive),
    "retention": ("retention", parse_retention),
    "host": ("host", parse_host),
    "on_finish": ("on_finish", parse_command),
    "hook_timeout": ("hook_timeout_s", parse_duration),
    "hooks_per_user": ("hooks_per_user", parse_hook_count),
    "hooks_total": ("hooks_total", parse_hook_count),
    "hook_output_max": ("hook_output_max_bytes", parse_size),
    "metrics": ("metrics_address", parse_address),
    "metrics_scraper": ("metrics_scraper", parse_ip),
    "web": ("web_address", parse_web_address),
    "client_idle_timeout": ("client_idle_timeout_s", parse_duration),
    "client_request_timeout": ("client_request_timeout_s", parse_duration),
    "max_array_jobs": ("max_array_jobs", parse_count_bound),
    "max_submit_bytes": ("max_submit_bytes", parse_size_bound),
    "max_job_bytes": ("max_job_bytes", parse_size_bound),
    "max_env_bytes": ("max_env_bytes", parse_size_bound),
    "status_page_jobs": ("status_page_jobs", parse_count_bound),
    "node": ("node", parse_node_name),
    "node_timeout": ("node_timeout_s", parse_node_timeout),
    "admins": ("admins", parse_admins),
}


def _bad(source: str, key: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}: key '{key}': {problem}")


def _convert(source: str, key: str, value: Any) -> dict[str, Any]:
    """Turn one YAML key into Config field values, or raise naming file and key."""
    row = _KEYS.get(key)
    if row is None:
        raise _bad(source, key, "unknown key (see config/gpusched.yaml for the keys)")
    name, parse = row
    try:
        parsed = parse(value)
    except UsageError as exc:
        raise _bad(source, key, exc.message) from None
    return parsed if name is None else {name: parsed}


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read `path` (or the default location if it exists) over the defaults.

    A path that was named explicitly must exist; the default location may be absent.
    `overrides` are YAML-style keys from the command line (e.g. {"simulate": "2x24G"}).
    """
    base = default_config()
    data: dict[str, Any] = {}
    source = "defaults"
    if path is None and _is_root() and SYSTEM_CONFIG_PATH.exists():
        path = SYSTEM_CONFIG_PATH
    if path is not None:
        # Only the daemon and a client given a config file pay for YAML.
        from gpusched.config.reading import read_config_file

        source = str(path)
        data.update(read_config_file(Path(path)))
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    values: dict[str, Any] = {"source": source}
    for key, value in data.items():
        values.update(_convert(source, str(key), value))
    if "state_dir" in data:
        # A state directory named alone holds the whole state: two daemons given two state
        # directories must not share one database (or one log directory) unawares.
        state_dir = values["state_dir"]
        if "database" not in data:
            values["database_url"] = f"sqlite:///{state_dir / 'gpusched.db'}"
        if "log_dir" not in data:
            values["log_dir"] = state_dir / "jobs"
    known = {f.name for f in fields(Config)}
    config = replace(base, **{k: v for k, v in values.items() if k in known})
    shared = config.node is not None or not config.database_url.startswith("sqlite")
    if shared and config.node_timeout_s < 3 * config.poll_interval_s:  # renewed each poll
        raise ConfigError(
            f"{source}: key 'node_timeout': {config.node_timeout_s:g}s is less than three"
            f" poll intervals ({3 * config.poll_interval_s:g}s): every node would look down"
        )
    return config
