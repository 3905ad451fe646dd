"""Configuration: YAML keys, defaults for root and for everyone else, and error messages."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpusched.config.settings import (
    SYSTEM_SOCKET_PATH,
    Config,
    config_path_from_env,
    default_config,
    load_config,
)
from gpusched.core.errors import ConfigError, UsageError
from tests.daemon_harness import eventually

G, M = 2**30, 2**20


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Run as an ordinary user (uid 1000) with private runtime and state directories."""
    runtime = tmp_path / "run"
    state = tmp_path / "state"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return runtime, state


def write(tmp_path: Path, text: str, name: str = "gpusched.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -- every key -----------------------------------------------------------------------------


def test_every_key_is_read(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(
        tmp_path,
        """\
        socket: /tmp/x/gpusched.sock
        database: sqlite:////tmp/x/jobs.db
        state_dir: /tmp/x/state
        log_dir: /tmp/x/logs
        poll_interval: 500ms
        headroom: 1G
        gpus: [0, GPU-abc]
        simulate: 2x24G
        max_jobs_per_gpu: 3
        visible_devices: uuid
        kill_grace: 1m
        show_commands: true
        admins: [alice, bob]
        """,
    )
    config = load_config(path)
    assert config == Config(
        socket_path=Path("/tmp/x/gpusched.sock"),
        database_url="sqlite:////tmp/x/jobs.db",
        state_dir=Path("/tmp/x/state"),
        log_dir=Path("/tmp/x/logs"),
        poll_interval_s=0.5,
        headroom_bytes=G,
        gpus=(0, "GPU-abc"),
        simulate="2x24G",
        max_jobs_per_gpu=3,
        visible_devices="uuid",
        kill_grace_s=60.0,
        show_commands=True,
        admins=("alice", "bob"),
        source=str(path),
    )


@pytest.mark.parametrize(
    ("yaml_line", "field", "expected"),
    [
        ("headroom: 0", "headroom_bytes", 0),
        ("headroom: '0'", "headroom_bytes", 0),
        ("headroom: 256M", "headroom_bytes", 256 * M),
        ("headroom: 1048576", "headroom_bytes", M),
        ("poll_interval: 5", "poll_interval_s", 5.0),
        ("poll_interval: 0.5", "poll_interval_s", 0.5),
        ("gpus: all", "gpus", None),
        ("gpus: null", "gpus", None),
        ("gpus: 1", "gpus", (1,)),
        ("gpus: GPU-1234", "gpus", ("GPU-1234",)),
        ("simulate: null", "simulate", None),
        ("simulate: 24G,16G", "simulate", "24G,16G"),
        ("simulate_util: 0", "simulate_util", 0),
        ("simulate_util: 95%", "simulate_util", 95),
        ("simulate_util: 100", "simulate_util", 100),
        ("max_jobs_per_gpu: null", "max_jobs_per_gpu", None),
        ("max_log_size: 1M", "max_log_bytes", M),
        ("max_log_size: 0", "max_log_bytes", None),
        ("max_log_size: null", "max_log_bytes", None),
        ("max_jobs_per_gpu: 1", "max_jobs_per_gpu", 1),
        ("busy_util: null", "busy_util", None),
        ("busy_util: 90%", "busy_util", 90.0),
        ("busy_util: 100", "busy_util", 100.0),
        ("busy_util: 97.5", "busy_util", 97.5),
        ("visible_devices: index", "visible_devices", "index"),
        ("show_commands: false", "show_commands", False),
        ("admins: []", "admins", ()),
        ("admins: null", "admins", ()),
        ("state_dir: ~/gs", "state_dir", "HOME/gs"),
        ("web: null", "web_address", None),
        ("web: 127.0.0.1:8080", "web_address", ("127.0.0.1", 8080)),
        ("web: '[::1]:8080'", "web_address", ("::1", 8080)),
        ("web: gpu-server.lab:8080", "web_address", ("gpu-server.lab", 8080)),
        ("web: ':8080'", "web_address", ("0.0.0.0", 8080)),  # noqa: S104 - as written
        ("web: 8080", "web_address", ("127.0.0.1", 8080)),
    ],
)
def test_single_key_values(
    tmp_path: Path, user_env: tuple[Path, Path], yaml_line: str, field: str, expected: object
) -> None:
    config = load_config(write(tmp_path, yaml_line + "\n"))
    if expected == "HOME/gs":
        expected = tmp_path / "home" / "gs"
    assert getattr(config, field) == expected


def test_empty_file_gives_defaults(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(tmp_path, "# nothing set\n")
    config = load_config(path)
    assert config == dataclasses.replace(default_config(), source=str(path))


# -- defaults ------------------------------------------------------------------------------


def test_defaults_when_no_file(user_env: tuple[Path, Path]) -> None:
    runtime, state = user_env
    config = load_config(None)
    assert config.source == "defaults"
    assert config.socket_path == runtime / "gpusched.sock"
    assert config.database_url == f"sqlite:///{state / 'gpusched' / 'gpusched.db'}"
    assert config.poll_interval_s == 2.0
    assert config.headroom_bytes == 512 * M
    assert config.gpus is None
    assert config.simulate is None
    assert config.max_jobs_per_gpu is None
    assert config.visible_devices == "index"
    assert config.kill_grace_s == 10.0
    assert config.show_commands is False
    assert config.admins == ()


def test_non_root_defaults_use_xdg_directories(user_env: tuple[Path, Path]) -> None:
    runtime, state = user_env
    config = default_config()
    assert config.socket_path == runtime / "gpusched.sock"
    assert config.database_url == f"sqlite:///{state}/gpusched/gpusched.db"
    assert config.database_url.startswith("sqlite:////")  # an absolute path: four slashes
    assert config.state_dir == state / "gpusched"
    assert config.log_dir.is_relative_to(state / "gpusched")


def test_non_root_defaults_without_xdg_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = default_config()
    state = tmp_path / ".local" / "state" / "gpusched"
    assert config.state_dir == state
    assert config.database_url == f"sqlite:///{state / 'gpusched.db'}"
    assert config.socket_path.is_relative_to(state)
    assert config.log_dir.is_relative_to(state)


def test_root_defaults_are_system_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/should/not/be/used")
    config = default_config()
    assert config.socket_path == SYSTEM_SOCKET_PATH == Path("/run/gpusched/gpusched.sock")
    assert config.database_url == "sqlite:////var/lib/gpusched/gpusched.db"
    assert config.state_dir == Path("/var/lib/gpusched")
    assert config.log_dir == Path("/var/log/gpusched/jobs")


def test_defaults_of_a_real_non_root_process() -> None:
    """The same as above without monkeypatching: a subprocess that really is not root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    code = "from gpusched.config.settings import load_config; c = load_config(None); "
    code += "print(c.socket_path); print(c.database_url)"
    env = {  # the paths need not exist: the defaults are only computed here
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "XDG_RUNTIME_DIR": "/run/user/65534",
        "XDG_STATE_HOME": "/nonexistent/state",
    }
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            user=65534,
            group=65534,
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except PermissionError:
        pytest.skip(f"{sys.executable} cannot be run by uid 65534 here")
    if result.returncode != 0 and "Permission denied" in result.stderr:
        pytest.skip("the gpusched package cannot be read by uid 65534 here")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "/run/user/65534/gpusched.sock",
        "sqlite:////nonexistent/state/gpusched/gpusched.db",
    ]


# -- errors name the file and the key -------------------------------------------------------


def test_missing_named_file(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    missing = tmp_path / "nope" / "gpusched.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(missing) in info.value.message
    assert "not found" in info.value.message


def test_a_config_name_holding_a_nul_byte_is_not_found(user_env: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Path("/etc/gpusched\0.yaml"))
    assert info.value.message == "'/etc/gpusched\\x00.yaml': config file not found"


def test_unreadable_path(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)  # a directory
    assert str(tmp_path) in info.value.message


def test_bad_yaml_names_file_and_line(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(tmp_path, "socket: /tmp/x\nheadroom: [1G\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in info.value.message
    assert "YAML" in info.value.message
    assert "line" in info.value.message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_not_a_mapping(tmp_path: Path, user_env: tuple[Path, Path], text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="mapping") as info:
        load_config(path)
    assert str(path) in info.value.message


def test_unknown_key(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(tmp_path, "headroom: 1G\npoll_intervall: 2s\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in info.value.message
    assert "'poll_intervall'" in info.value.message
    assert "unknown key" in info.value.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("database", "/var/lib/gpusched.db"),
        ("socket", "123"),
        ("socket", "./gpusched.sock"),
        ("state_dir", "[a, b]"),
        ("state_dir", "''"),
        ("state_dir", "null"),
        ("state_dir", "~no-such-user-here/gs"),
        ("log_dir", "logs"),
        ("log_dir", "{a: 1}"),
        ("log_dir", '"/var/log/x\\0y"'),
        ("poll_interval", "fast"),
        ("poll_interval", "0s"),
        ("poll_interval", "nan"),
        ("kill_grace", "-1s"),
        ("headroom", "lots"),
        ("headroom", "-1G"),
        ("gpus", "[]"),
        ("gpus", "[{a: 1}]"),
        ("simulate", "2x"),
        ("simulate", "0x24G"),
        ("simulate_util", "101"),
        ("simulate_util", "-1"),
        ("simulate_util", "9.5"),
        ("simulate_util", "true"),
        ("simulate_util", "null"),
        ("max_jobs_per_gpu", "0"),
        ("max_jobs_per_gpu", "two"),
        ("max_jobs_per_gpu", "true"),
        ("max_jobs_per_gpu", "1.5"),
        ("max_log_size", "1K"),
        ("max_log_size", "lots"),
        ("busy_util", "0"),
        ("busy_util", "101%"),
        ("busy_util", "busy"),
        ("busy_util", "true"),
        ("busy_util", "nan"),
        ("visible_devices", "serial"),
        ("show_commands", "yes please"),
        ("show_commands", "1"),
        ("admins", "alice"),
        ("admins", "[alice, 3]"),
        ("web", "localhost:http"),
        ("web", "127.0.0.1:70000"),
        ("web", "127.0.0.1.8080"),
        ("web", "'[gpu-server]:8080'"),
        ("web", "'local host:8080'"),
        ("web", "'-x:8080'"),
    ],
)
def test_bad_value_names_file_and_key(
    tmp_path: Path, user_env: tuple[Path, Path], key: str, value: str
) -> None:
    path = write(tmp_path, f"{key}: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = info.value.message
    assert message.startswith(f"{path}: key '{key}': ")
    assert "\n" not in message


def test_config_error_is_a_usage_error() -> None:
    assert issubclass(ConfigError, UsageError)


# -- overrides -----------------------------------------------------------------------------


def test_overrides_without_file(user_env: tuple[Path, Path]) -> None:
    config = load_config(None, {"simulate": "2x24G", "headroom": "1G"})
    assert config.simulate == "2x24G"
    assert config.headroom_bytes == G
    assert config.source == "defaults"


def test_overrides_win_over_the_file(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(tmp_path, "simulate: 1x80G\nheadroom: 2G\n")
    config = load_config(path, {"simulate": "2x24G", "headroom": None})
    assert config.simulate == "2x24G"
    assert config.headroom_bytes == 2 * G  # None means "not given on the command line"


def test_bad_override_is_a_config_error(user_env: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="'simulate'"):
        load_config(None, {"simulate": "lots of GPUs"})


def test_config_is_frozen(user_env: tuple[Path, Path]) -> None:
    config = load_config(None)
    with pytest.raises(AttributeError):
        config.headroom_bytes = 0  # type: ignore[misc]


# -- where the file comes from --------------------------------------------------------------


def test_config_path_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_CONFIG", "/etc/from-env.yaml")
    assert config_path_from_env("/etc/explicit.yaml") == Path("/etc/explicit.yaml")
    assert config_path_from_env(None) == Path("/etc/from-env.yaml")
    monkeypatch.delenv("GPUSCHED_CONFIG")
    assert config_path_from_env(None) is None


def test_node_name_and_timeout_are_validated() -> None:
    config = load_config(None, {"node": "gpu-3.lab", "node_timeout": "45s"})
    assert (config.node, config.node_timeout_s) == ("gpu-3.lab", 45.0)
    assert load_config(None, {}).node is None  # one server: named after its host later
    for key, value, words in (
        ("node", "a b", "expected a name of letters, digits"),
        ("node", "", "expected a name of letters, digits"),
        ("node_timeout", "1s", "expected at least 3s"),
    ):
        with pytest.raises(ConfigError, match=words):
            load_config(None, {key: value})
    # In a cluster a lease renewed once per poll must outlive a few polls.
    with pytest.raises(ConfigError, match="less than three poll intervals"):
        load_config(None, {"node": "a", "poll_interval": "20s", "node_timeout": "30s"})
    assert load_config(None, {"poll_interval": "20s"}).node_timeout_s == 30.0  # one server


def test_state_dir_alone_takes_the_database_and_logs_with_it(tmp_path: Path) -> None:
    """Two daemons' configs, as root, each naming only its own state_dir: each gets its
    own database and log directory inside it, never /var/lib/gpusched's shared one."""
    configs = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"state_dir: {tmp_path / name}\n")
        configs.append(load_config(path))
    a, b = configs
    assert a.database_url == f"sqlite:///{tmp_path / 'a' / 'gpusched.db'}"
    assert a.log_dir == tmp_path / "a" / "jobs"
    assert a.database_url != b.database_url and a.log_dir != b.log_dir
    named = tmp_path / "c.yaml"
    named.write_text(
        f"state_dir: {tmp_path / 'c'}\ndatabase: sqlite:////x/y.db\nlog_dir: /x/logs\n"
    )
    both = load_config(named)
    assert (both.database_url, both.log_dir) == ("sqlite:////x/y.db", Path("/x/logs"))


# -- the file itself: every way it can be wrong is one line ---------------------------------


def daemon_start(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """The real `gpusched daemon` on `config` (simulated GPUs): it must refuse to start."""
    return subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon", "--simulate", "1x8G", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "XDG_RUNTIME_DIR": str(tmp_path),
            "XDG_STATE_HOME": str(tmp_path / "state"),
        },
        check=False,
    )


def refused_in_one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the daemon's own log lines
    assert last.startswith("gpusched: "), result.stderr
    for word in words:
        assert word in last, result.stderr
    return last


def test_a_file_that_is_not_utf8_is_refused_naming_the_byte(
    tmp_path: Path, user_env: tuple[Path, Path]
) -> None:
    path = tmp_path / "gpusched.yaml"
    path.write_bytes(b"headroom: 1G\nnode: caf\xe9\n")  # Latin-1: byte 22 starts no character
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == f"{path}: not valid UTF-8 at byte 22 (line 2): save it as UTF-8"


def test_the_daemon_refuses_to_start_on_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.yaml"
    path.write_bytes(b"headroom: \xff\xfe\n")
    result = daemon_start(tmp_path, path)
    assert result.returncode == 2, result.stderr
    assert refused_in_one_line(result, str(path), "not valid UTF-8 at byte 10")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("name", ["/dev/null", "a directory"])
def test_a_config_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, user_env: tuple[Path, Path], name: str
) -> None:
    path = tmp_path if name == "a directory" else Path(name)
    with pytest.raises(ConfigError, match="cannot read config file: not a regular file"):
        load_config(path)


def test_a_config_file_larger_than_a_config_is_refused(
    tmp_path: Path, user_env: tuple[Path, Path]
) -> None:
    path = write(tmp_path, "# padding\n" * 200_000)  # 2 MB of comments
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(path)


def test_yaml_anchors_and_aliases_are_refused(tmp_path: Path, user_env: tuple[Path, Path]) -> None:
    path = write(tmp_path, "web: &port 127.0.0.1:8080\nmetrics: *port\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == (
        f"{path}: line 1: a YAML anchor (&port) is not allowed in a config file:"
        " write each value out"
    )
    path.write_text("web: 127.0.0.1:8080\nmetrics: *port\n")  # an alias alone, undefined
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == (
        f"{path}: line 2: a YAML alias (*port) is not allowed in a config file"
    )


def test_an_alias_bomb_is_refused_before_it_is_expanded(
    tmp_path: Path, user_env: tuple[Path, Path]
) -> None:
    """Nine levels are 10**9 strings once the value is walked (str() of it, here); four
    levels here, 10**4 strings, so that a loader that expands them costs little."""
    levels = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"&a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 4)]
    path = write(tmp_path, "node:\n" + "".join(f"  - {level}\n" for level in levels))
    with pytest.raises(ConfigError, match=r"line 2: a YAML anchor \(&a0\) is not allowed"):
        load_config(path)


def test_a_key_given_twice_is_refused_naming_it_and_its_line(
    tmp_path: Path, user_env: tuple[Path, Path]
) -> None:
    path = write(tmp_path, "headroom: 1G\npoll_interval: 2s\nheadroom: 2G\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == f"{path}: line 3: key 'headroom' is given twice"
    nested = write(tmp_path, "limits:\n  users:\n    alice: {}\n    alice: {max_running: 1}\n")
    with pytest.raises(ConfigError, match="line 4: key 'alice' is given twice"):
        load_config(nested)


@pytest.mark.parametrize(
    ("yaml_line", "expected"),
    [
        ("state_dir: [a, b]", "expected an absolute path, not ['a', 'b']"),
        ("socket: 123", "expected an absolute path, not 123"),
        (
            "log_dir: jobs/logs",
            "expected an absolute path, not 'jobs/logs' (a relative one would depend on the"
            " daemon's working directory)",
        ),
    ],
)
def test_a_path_key_takes_an_absolute_path_only(
    tmp_path: Path, user_env: tuple[Path, Path], yaml_line: str, expected: str
) -> None:
    path = write(tmp_path, yaml_line + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    key = yaml_line.partition(":")[0]
    assert info.value.message == f"{path}: key '{key}': {expected}"


def test_the_daemon_takes_a_relative_socket_option_from_where_it_is_run(tmp_path: Path) -> None:
    """`gpusched daemon --socket d.sock`: the shell's directory, as a client given the same
    relative path reads it; only a config file's paths must be absolute."""
    config = write(tmp_path, f"state_dir: {tmp_path / 'state'}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "gpusched", "--config", str(config), "daemon"]
    said = tmp_path / "daemon.stderr"
    with (
        said.open("w") as stderr,
        subprocess.Popen(
            [*argv, "--simulate", "1x8G", "--socket", "d.sock"],
            cwd=tmp_path,
            env=env,
            stderr=stderr,
        ) as daemon,
    ):
        try:
            eventually(lambda: "ready:" in said.read_text() or daemon.poll() is not None, 60)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    assert f"ready: listening on {tmp_path / 'd.sock'}" in said.read_text(), said.read_text()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://gpusched@dbhost/gpusched", "not a mysql one"),
        ("postgres://gpusched@dbhost/gpusched", "not a postgres one"),
        ("postgresql+asyncpg://gpusched@dbhost/gpusched", "not a postgresql+asyncpg one"),
        ("postgresql://gpusched@dbhost/gpusched", "write postgresql+psycopg://"),
        ("sqlite:///gpusched.db", "an absolute path"),
        ("sqlite:///~/gpusched.db", "an absolute path"),
        ("sqlite://", "an absolute path"),
        ("'sqlite:///:memory:'", "an absolute path"),
        ("sqlite:////var/lib/gpusched/gpusched.db?mode=ro", "no ?options"),
        ("123", "expected an SQLAlchemy URL"),
        ("[sqlite:////x.db]", "expected an SQLAlchemy URL"),
    ],
)
def test_only_sqlite_files_and_postgresql_are_databases(
    tmp_path: Path, user_env: tuple[Path, Path], url: str, expected: str
) -> None:
    path = write(tmp_path, f"database: {url}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message.startswith(f"{path}: key 'database': ")
    assert expected in info.value.message
    assert "\n" not in info.value.message


def test_the_databases_gpusched_runs_on_are_accepted(user_env: tuple[Path, Path]) -> None:
    for url in (
        "sqlite:////var/lib/gpusched/gpusched.db",
        "postgresql+psycopg://gpusched@dbhost/gpusched?sslmode=verify-full",
        "postgresql+psycopg://gpusched@/gpusched?host=/run/postgresql",
    ):
        assert load_config(None, {"database": url}).database_url == url


def test_the_daemon_refuses_a_mysql_database_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"state_dir: {tmp_path / 'state'}\ndatabase: mysql://u@h/db\n")
    result = daemon_start(tmp_path, path)
    assert result.returncode == 2, result.stderr
    assert refused_in_one_line(result, "key 'database'", "not a mysql one")


# -- the daemon's start: what the config names must be usable, or one line ------------------

NOWHERE = Path("/proc/gpusched-nowhere")  # no one, root included, can make a directory here


@pytest.mark.parametrize(
    ("key", "where", "expected"),
    [
        ("state_dir", "state", "state_dir {}: cannot create it: No such file or directory"),
        ("log_dir", "logs", "log_dir {}: cannot create it: No such file or directory"),
        ("socket", "gpusched.sock", "socket {}: cannot listen there: No such file or directory"),
        ("database", "gpusched.db", "database sqlite:///{}: cannot create it: No such file"),
        ("state_dir", "a file", "state_dir {}: not a directory"),
        ("socket", "x" * 120, "socket {}: cannot listen there: AF_UNIX path too long"),
    ],
)
def test_a_daemon_refuses_a_place_it_cannot_write_in_one_line(
    tmp_path: Path, key: str, where: str, expected: str
) -> None:
    """A directory that cannot be made (a read-only file system says the same), or a file
    where a directory should be: once a traceback each."""
    settings = {
        "socket": str(tmp_path / "gpusched.sock"),
        "state_dir": str(tmp_path / "state"),
        "log_dir": str(tmp_path / "logs"),
        "database": f"sqlite:///{tmp_path / 'gpusched.db'}",
    }
    place = NOWHERE / where
    if where == "a file":
        place = tmp_path / "a file"
        place.write_text("")
    elif len(where) > 100:  # a Unix socket name holds 107 bytes
        place = tmp_path / where
    settings[key] = f"sqlite:///{place}" if key == "database" else str(place)
    config = write(tmp_path, "".join(f"{name}: {value}\n" for name, value in settings.items()))
    refused_in_one_line(daemon_start(tmp_path, config), expected.format(place))


def test_host_mem_is_each_jobs_cap_by_default_and_per_user(
    tmp_path: Path, user_env: tuple[Path, Path]
) -> None:
    path = write(
        tmp_path,
        "limits:\n  default: {host_mem: 8G}\n  users:\n    alice: {host_mem: 32G}\n"
        "    bob: {max_running: 1}\n",
    )
    config = load_config(path)
    assert config.limits_for("carol").host_mem_bytes == 8 * 2**30
    assert config.limits_for("alice").host_mem_bytes == 32 * 2**30
    assert config.limits_for("bob").host_mem_bytes == 8 * 2**30
    assert load_config(write(tmp_path, "limits: {}\n")).limits_for("x").host_mem_bytes is None
    with pytest.raises(ConfigError, match="invalid size '0': must be more than zero"):
        load_config(write(tmp_path, "limits:\n  default: {host_mem: 0}\n"))
