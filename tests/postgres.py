"""A private PostgreSQL server for the tests: Debian's `postgresql` binaries.

`PostgresServer.start()` runs `initdb` into a fresh temporary directory owned by the
`postgres` user (run as root, initdb and the server run as `postgres` through runuser;
as anyone else, as that user), and starts the server with its Unix socket in that
directory, named after a free port number so that several test sessions on one machine
never meet. It also listens on 127.0.0.1 at that port, with a password (SCRAM) that only
this session knows: the fault tests put a proxy (tests/faultproxy.py) between a daemon and
that address. `stop()` always ends it with pg_ctl; `restart()` stops and starts it.

Each test gets its own database, copied from a template already at the store's schema
(`CREATE DATABASE ... TEMPLATE`: a file copy, far cheaper than running the migrations),
with the server-side bounds that docs/cluster.md section 1 tells an administrator to set
on the gpusched database (`SERVER_BOUNDS`, scaled to the tests' short node_timeout).
Nothing is skipped: without PostgreSQL's binaries the fixture fails, saying what to install
(.ci/run installs the package).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

SERVER_USER = "postgres"
TEMPLATE = "gpusched_template"

# docs/cluster.md section 1's `ALTER DATABASE gpusched SET ...`, for the tests' node_timeout
# of 4 s (tests/cluster_harness.py): a transaction left open by a node cut off from the
# database loses its locks after half a node_timeout; a lock or a statement waits at most
# a few seconds; TCP gives up on a silent client within about 11 s.
SERVER_BOUNDS: dict[str, str] = {
    "idle_in_transaction_session_timeout": "2s",
    "lock_timeout": "2s",
    "statement_timeout": "4s",
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "client_connection_check_interval": "2s",
}


def server_binaries() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL's server binaries are missing (/usr/lib/postgresql/*/bin/initdb):"
            " apt-get install postgresql"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, *, fsync: bool = False) -> None:
        self.bin = server_binaries()
        # In /tmp whatever TMPDIR says: the `postgres` user must reach it, and the socket's
        # path must stay within the 107 bytes a Unix socket address holds.
        self.root = Path(tempfile.mkdtemp(prefix="gpusched-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.fsync = fsync  # off for the tests (a crash of the test server loses nothing)
        self._as_server_user: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as_server_user = ["runuser", "-u", SERVER_USER, "--"]
        self.superuser = SERVER_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self._names = itertools.count(1)
        self.running = False
        self.password = secrets.token_hex(16)  # for TCP only; the Unix socket trusts root

    # -- the server ---------------------------------------------------------------------------

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [*self._as_server_user, *argv],
            capture_output=True,
            text=True,
            cwd=self.root,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stderr.strip()[-2000:]}")

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.superuser,
            "--auth-local=trust",  # a socket in a private directory: only root reaches it
            "--auth-host=scram-sha-256",  # 127.0.0.1 is open to every local user
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -k {self.root} -p {self.port}"
        if not self.fsync:
            options += " -c fsync=off -c full_page_writes=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: sessions ended, `immediate`: a crash) and start it."""
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server (if it runs) and delete its files: always, at the session's end."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ----------------------------------------------------------------------------

    def url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{self.superuser}@/{database}?host={self.root}&port={self.port}"

    def tcp_url(self, database: str, port: int | None = None) -> str:
        """`database` over TCP at 127.0.0.1:`port` (a proxy's; default the server's own).

        No password in it (a daemon refuses a config file holding one unless private):
        give the client PGPASSWORD=`self.password`. No TLS and no GSSAPI negotiation, so
        that the proxy sees PostgreSQL's messages from the first byte.
        """
        return (
            f"postgresql+psycopg://{self.superuser}@127.0.0.1:{port or self.port}/{database}"
            "?sslmode=disable&gssencmode=disable"
        )

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.root),
            port=self.port,
            user=self.superuser,
            dbname="postgres",
            autocommit=True,
        )

    def create_database(
        self, template: str = "template0", bounds: dict[str, str] | None = None
    ) -> str:
        """A new database with the server-side bounds (SERVER_BOUNDS unless given)."""
        name = f"test_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
            for setting, value in (SERVER_BOUNDS if bounds is None else bounds).items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                    )
                )
        return name

    def backends(self, database: str) -> list[tuple[str, str]]:
        """(state, query) of each client session of `database` (pg_stat_activity)."""
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT state, query FROM pg_stat_activity"
                " WHERE datname = %s AND backend_type = 'client backend'",
                (database,),
            ).fetchall()
        return [(str(state), str(query)) for state, query in rows]

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def make_template(self) -> None:
        """The store's schema, once, in TEMPLATE (copied by each test's database)."""
        from gpusched.store import Store

        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(self.superuser), sql.Literal(self.password)
                )
            )
        Store(self.url(TEMPLATE)).close()
        with self.admin() as conn:  # no one may stay connected to a template being copied
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
                    sql.Identifier(TEMPLATE)
                )
            )


@contextlib.contextmanager
def private_server(*, fsync: bool = False) -> Iterator[PostgresServer]:
    server = PostgresServer(fsync=fsync)
    try:
        server.init()
        server.start()
        server.make_template()
        yield server
    finally:
        server.close()
